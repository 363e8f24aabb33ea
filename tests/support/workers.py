"""An in-process worker for tests that need runs to run."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from runlease.settings import WorkerSettings, load
from runlease.worker.worker import Worker

_ids = itertools.count()
# For tests whose tools write their evidence to the test's own files (a
# sandboxed tool sees none of the host's /tmp): tools run unsandboxed, every
# tenant's, which the pool's name written out allows (worker/sandbox.py).
HOST_FILES: dict[str, Any] = {"tool_sandbox": False, "unsandboxed_pool": "default"}


@asynccontextmanager
async def running_worker(
    db_url: str, agent: Callable[..., Awaitable[Any]] | None = None,
    tool_grant: frozenset[str] = frozenset(), **settings: Any
) -> AsyncIterator[Worker]:
    values: dict[str, Any] = {
        "agent": "runlease.agents.script:agent",
        "database_url": db_url,
        "metrics_port": 0,
        "lease_s": 6,
        "heartbeat_interval_s": 1,
        "poll_interval_s": 0.2,
        "reaper_interval_s": 0.5,
        "cancel_grace_s": 1,
        "tool_kill_grace_s": 1,
    } | settings
    worker = Worker(load(WorkerSettings, values, environ={}), agent=agent,
                    identity=f"test-worker-{next(_ids)}", handle_signals=False,
                    # Sealing would take secrets out of the test process's own
                    # environment; real worker processes (tests/support/proc.py) seal.
                    tool_grant=tool_grant, seal_environ=False)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(worker.started.wait(), 10)
    try:
        yield worker
    finally:
        worker.drain()
        assert await asyncio.wait_for(task, 30) == 0
