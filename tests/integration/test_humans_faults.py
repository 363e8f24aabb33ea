"""Waiting for people, and messages, through kill -9 (issue 28): real
`runlease worker` processes, a real PostgreSQL, real signals."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runlease.db.connect import make_conn_pool
from runlease.db.models import Pool
from runlease.db.store import RunStore
from tests.support.proc import WorkerProcess
from tests.support.waiting import until
from tests.support.workers import HOST_FILES

pytestmark = pytest.mark.slow

FAST = {"agent": "runlease.agents.script:agent", "lease_s": 2, "heartbeat_interval_s": 0.5,
        "poll_interval_s": 0.5, "reaper_interval_s": 0.5, "leader_ttl_s": 2, **HOST_FILES}


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(name: str, **settings: Any) -> WorkerProcess:
        process = WorkerProcess(db_url, tmp_path, name, FAST | settings).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.cleanup()


def query(db_url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


async def status(store: RunStore, run_id: Any) -> str:
    return str((await store.get(run_id)).status)


async def test_a_run_waits_through_kill_9_and_long_past_its_lease_then_goes_on_once(
    db_url: str, workers: Any, tmp_path: Path
) -> None:
    """Invariant 12 with real processes: the worker that parked the run is
    killed; the run stays waiting for many lease periods, never reclaimed
    nor reaped, holding no slot of its capped tenant; answered (five times
    at once), exactly one attempt goes on from the wait step."""
    log = tmp_path / "executions.log"

    def record(name: str) -> dict[str, Any]:
        return {"shell": ["sh", "-c", f"echo {name} >> {log}"]}
    async with make_conn_pool(db_url, max_size=8) as pool:
        store = RunStore(pool)
        await store.upsert_pool(Pool("default", default_max_in_flight=1))
        first = workers("w1")
        run = (await store.enqueue("default", "acme", {"steps": [
            record("before"), {"input": {"name": "approve", "schema": {"type": "boolean"}}},
            record("after")]}, max_attempts=1)).run

        async def parked() -> bool:
            return await status(store, run.id) == "waiting"
        await until(parked, what="the run to wait for its approval", timeout_s=30)
        first.kill9()
        second = workers("w2")
        # Another run of the capped tenant starts: the waiting run holds no slot.
        other = (await store.enqueue("default", "acme", {"steps": [record("other")]})).run

        async def other_done() -> bool:
            return await status(store, other.id) == "done"
        await until(other_done, what="the tenant's other run", timeout_s=30)
        waited_from = time.monotonic()
        while time.monotonic() - waited_from < 3 * FAST["lease_s"]:
            held = await store.get(run.id)
            assert (held.status, held.locked_by, held.attempts) == ("waiting", None, 0)
            await asyncio.sleep(0.5)
        answers = await asyncio.gather(*(store.give_input(run.id, "approve", True)
                                         for _ in range(5)))
        assert sorted(answers) == [False, False, False, False, True]

        async def done() -> bool:
            return await status(store, run.id) == "done"
        await until(done, what="the answered run to finish", timeout_s=30)
        final = await store.get(run.id)
        kinds = [e.kind for e in await store.events_after(run.id)]
    assert final.attempts == 1
    assert log.read_text().split() == ["before", "other", "after"]
    assert kinds.count("input.answered") == 1
    assert "run.reaped" not in kinds
    del second
    assert query(db_url, "SELECT count(*) FROM agent_run_steps WHERE run_id = %s "
                         "AND step_key = 'input:approve'", run.id) == [(1,)]


async def test_messages_reach_the_agent_once_across_a_reclaim_by_another_worker(
    db_url: str, workers: Any, tmp_path: Path
) -> None:
    """Message 1 is taken by the first worker, which is then killed in the
    middle of a step; message 2 is sent while nobody holds the run. The
    second worker replays message 1 (not taken again) and takes message 2."""
    gate = tmp_path / "gate"
    async with make_conn_pool(db_url, max_size=4) as pool:
        store = RunStore(pool)
        first = workers("w1")
        run = (await store.enqueue("default", "acme", {"steps": [
            {"receive": {"timeout_s": 60}},
            {"shell": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]},
            {"receive": {"timeout_s": 60}}]})).run

        async def leased() -> bool:
            return await status(store, run.id) == "leased"
        await until(leased, what="the run to start", timeout_s=30)
        await store.send_message(run.id, "first")

        async def took_first() -> bool:
            return "0" in await store.get_steps(run.id)
        await until(took_first, what="the first message to be taken", timeout_s=30)
        first.kill9()
        await store.send_message(run.id, "second")
        gate.touch()
        workers("w2")

        async def done() -> bool:
            return await status(store, run.id) == "done"
        await until(done, what="the reclaimed run to finish", timeout_s=40)
        steps = await store.get_steps(run.id)
        final = await store.get(run.id)
    assert steps["0"].result["message"]["text"] == "first"
    assert steps["2"].result["message"]["text"] == "second"
    assert steps["message:1"].attempt == 1
    assert steps["message:2"].attempt == 2
    assert final.attempts == 2
    assert (final.inbox_seq, final.inbox_read) == (2, 2)
