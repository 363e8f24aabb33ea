"""A draining worker's per-run path: what it leaves behind for the collector.

The worker frees a finished run's objects by reference counting alone (and
collects its young generation rarely, cli/server.py): a cycle through a run's
handle or context would make every run garbage only the collector can free
(docs/benchmarks.md, the drain's profile). A run that fails may: its
exception's traceback holds the frames that hold it (the full way, rare).
"""

from __future__ import annotations

import gc
from typing import Any

from runlease.db.store import NewRun, RunStore
from runlease.worker.context import RunContext
from runlease.worker.handle import RunHandle
from tests.support.waiting import until
from tests.support.workers import running_worker


async def noop(ctx: RunContext) -> None:
    return None


async def _drain(live_store: RunStore, db_url: str, agent: Any, runs: int) -> list[Any]:
    """Drain `runs` runs with the collector off; the runs' handles and
    contexts that only the collector could free."""
    await live_store.enqueue_many("default", [NewRun("acme", {"n": i}, max_attempts=1)
                                              for i in range(runs)])
    gc.collect()
    gc.disable()
    try:
        async with running_worker(db_url, agent, concurrency=20):
            await until(lambda: _all_finished(live_store), timeout_s=60, what="the drain")
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found = [o for o in gc.garbage if isinstance(o, RunHandle | RunContext)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return found


async def _all_finished(store: RunStore) -> bool:
    return not await store.list_runs(status="pending", limit=1) and not await store.list_runs(
        status="leased", limit=1)


async def test_runs_that_return_leave_no_cycle(live_store: RunStore, db_url: str) -> None:
    assert await _drain(live_store, db_url, noop, 200) == []
    assert len(await live_store.list_runs(status="done", limit=500)) == 200
