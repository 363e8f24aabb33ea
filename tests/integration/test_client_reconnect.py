"""The client SDK's event iterator across a restart of the API process: it
reconnects with Last-Event-ID, and sees every event once, in order (issue 11,
item 11). Real `runlease api` and `runlease worker` processes; the API is
killed mid-stream and started again on the same port."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from runlease.client import AsyncClient, Client, RunEnded, StreamEvent
from runlease.db.embedded import EmbeddedPostgres
from tests.support.api import TOKENS
from tests.support.api_process import ApiProcess
from tests.support.pg import own_postgres
from tests.support.proc import WorkerProcess
from tests.support.waiting import until_sync

pytestmark = pytest.mark.slow

EVENTS = 60


def slow_emitter(n: int = EVENTS, pause_s: float = 0.1) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for i in range(n):
        steps += [{"emit": {"i": i}}, {"sleep": pause_s}]
    return {"steps": steps}


@pytest.fixture
def api(db_url: str, tmp_path: Path) -> Iterator[ApiProcess]:
    process = ApiProcess(db_url, tmp_path).start()
    yield process
    process.cleanup()


@pytest.fixture
def worker(db_url: str, tmp_path: Path) -> Iterator[WorkerProcess]:
    process = WorkerProcess(db_url, tmp_path, "w", {
        "agent": "runlease.agents.script:agent", "poll_interval_s": 0.2}).start()
    yield process
    process.cleanup()


def restart(api: ApiProcess, sig: int) -> None:
    """Stop the API (kill -9, or SIGTERM which ends every stream) and start a
    new one on the same port. Returns before it serves: the client must wait
    out the refused connections itself."""
    if sig == signal.SIGKILL:
        api.kill9()
    else:
        api.signal(sig)
        api.wait(30)
    api.start(wait=False)


def check(items: list[StreamEvent | RunEnded], restarts: int) -> None:
    events = [i for i in items if isinstance(i, StreamEvent)]
    seqs = [e.seq for e in events]
    # The worker's own events (run.claimed and the like) share the seq space.
    assert seqs == list(range(1, len(seqs) + 1)), f"missed or repeated: {seqs}"
    assert [e.data["i"] for e in events if "i" in e.data] == list(range(EVENTS))
    assert isinstance(items[-1], RunEnded)
    assert items[-1].status == "done"
    assert restarts == 2


def test_sync_events_survive_api_restarts(api: ApiProcess, worker: WorkerProcess) -> None:
    items: list[StreamEvent | RunEnded] = []
    restarts = 0
    with Client(api.url, TOKENS["acme"]) as client:
        run = client.submit(slow_emitter(), idempotency_key="reconnect-sync")
        for item in client.events(run.id):
            items.append(item)
            # Mid-stream, twice: after the 10th and the 30th event.
            if isinstance(item, StreamEvent) and item.data.get("i") in (10, 30):
                restart(api, signal.SIGKILL if restarts == 0 else signal.SIGTERM)
                restarts += 1
    check(items, restarts)


async def test_async_events_survive_api_restarts(api: ApiProcess,
                                                 worker: WorkerProcess) -> None:
    items: list[StreamEvent | RunEnded] = []
    restarts = 0
    async with AsyncClient(api.url, TOKENS["acme"]) as client:
        run = await client.submit(slow_emitter(), idempotency_key="reconnect-async")
        async for item in client.events(run.id):
            items.append(item)
            if isinstance(item, StreamEvent) and item.data.get("i") in (10, 30):
                sig = signal.SIGKILL if restarts == 0 else signal.SIGTERM
                await asyncio.to_thread(restart, api, sig)
                restarts += 1
    check(items, restarts)


# -- an API restarted while the database is down ----------------------------------------------


def events_route_503s(api: ApiProcess) -> int:
    try:
        text = httpx.get(f"{api.url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0
    pattern = r'runlease_api_requests_total\{[^}]*route="/v1/runs/\{run_id\}/events"' \
              r'[^}]*status="503"[^}]*\} ([0-9.]+)'
    return sum(int(float(m)) for m in re.findall(pattern, text))


class Outage:
    """At the 10th event: stop the database, kill -9 the API and start a new
    one; start the database again only once the new API has answered the
    client's reconnect with a 503 (its connection pool waited in vain)."""

    def __init__(self, pg: EmbeddedPostgres, api: ApiProcess) -> None:
        self.pg, self.api = pg, api
        self.thread: threading.Thread | None = None
        self.seen_503 = 0

    def begin(self) -> None:
        self.pg.stop("fast")
        self.api.kill9()
        self.api.start(wait=False)
        self.thread = threading.Thread(target=self._end, name="outage")
        self.thread.start()

    def _end(self) -> None:
        try:
            self.seen_503 = until_sync(lambda: events_route_503s(self.api), timeout_s=60,
                                       every_s=0.2, what="the new API to answer a 503")
        finally:
            self.pg.start()

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(90)


@pytest.fixture
def pg() -> Iterator[EmbeddedPostgres]:
    with own_postgres() as server:
        yield server


@pytest.fixture
def pg_api(pg: EmbeddedPostgres, tmp_path: Path) -> Iterator[ApiProcess]:
    process = ApiProcess(pg.url, tmp_path).start()
    yield process
    process.cleanup()


@pytest.fixture
def pg_worker(pg: EmbeddedPostgres, tmp_path: Path) -> Iterator[WorkerProcess]:
    process = WorkerProcess(pg.url, tmp_path, "w", {
        "agent": "runlease.agents.script:agent", "poll_interval_s": 0.2}).start()
    yield process
    process.cleanup()


def check_against_db(items: list[StreamEvent | RunEnded], url: str, run_id: object) -> None:
    with psycopg.connect(url) as conn:
        stored = [r[0] for r in conn.execute(
            "SELECT seq FROM agent_run_events WHERE run_id = %s ORDER BY seq", (run_id,))]
    assert [i.seq for i in items if isinstance(i, StreamEvent)] == stored
    assert stored == list(range(1, len(stored) + 1))
    assert isinstance(items[-1], RunEnded)
    assert items[-1].status == "done"


def test_sync_events_survive_an_api_restart_while_the_database_is_down(
    pg: EmbeddedPostgres, pg_api: ApiProcess, pg_worker: WorkerProcess
) -> None:
    outage = Outage(pg, pg_api)
    items: list[StreamEvent | RunEnded] = []
    try:
        with Client(pg_api.url, TOKENS["acme"]) as client:
            run = client.submit(slow_emitter(), idempotency_key="outage-sync")
            for item in client.events(run.id):
                items.append(item)
                if isinstance(item, StreamEvent) and item.data.get("i") == 10 \
                        and outage.thread is None:
                    outage.begin()
    finally:
        if outage.thread is not None:
            outage.join()
    assert outage.seen_503 >= 1
    check_against_db(items, pg.url, run.id)


async def test_async_events_survive_an_api_restart_while_the_database_is_down(
    pg: EmbeddedPostgres, pg_api: ApiProcess, pg_worker: WorkerProcess
) -> None:
    outage = Outage(pg, pg_api)
    items: list[StreamEvent | RunEnded] = []
    try:
        async with AsyncClient(pg_api.url, TOKENS["acme"]) as client:
            run = await client.submit(slow_emitter(), idempotency_key="outage-async")
            async for item in client.events(run.id):
                items.append(item)
                if isinstance(item, StreamEvent) and item.data.get("i") == 10 \
                        and outage.thread is None:
                    await asyncio.to_thread(outage.begin)
    finally:
        if outage.thread is not None:
            await asyncio.to_thread(outage.join)
    assert outage.seen_503 >= 1
    check_against_db(items, pg.url, run.id)
