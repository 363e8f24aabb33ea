"""The client SDK's event iterator across a restart of the API process: it
reconnects with Last-Event-ID, and sees every event once, in order (issue 11,
item 11). Real `runlease api` and `runlease worker` processes; the API is
killed mid-stream and started again on the same port."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runlease.client import AsyncClient, Client, RunEnded, StreamEvent
from tests.support.api import TOKENS
from tests.support.api_process import ApiProcess
from tests.support.proc import WorkerProcess

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
