"""Waking a pool's claimers after submits commit, coalesced.

A NOTIFY inside the submit's transaction makes the server serialize every
notifying commit (they queue on one lock while each waits for its own WAL
flush), which capped submits near 300/s. So the API enqueues without it and
asks this waker to NOTIFY the pools afterwards: one NOTIFY per pool per
flush, however many submits arrived meanwhile, from one task this object
owns. The NOTIFY follows the commit, so a woken claimer finds the runs. A lost
wakeup costs only latency: claimers also poll.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from runlease.db.channels import POOL_CHANNEL_PREFIX
from runlease.db.executor import Executor
from runlease.errors import RunleaseError

log = logging.getLogger(__name__)


class PoolWaker:
    """Coalesces pool wakeups; `close()` flushes what is left and ends its task."""

    def __init__(self, store: Executor) -> None:
        self.store = store
        self._due: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def wake(self, pools: Iterable[str]) -> None:
        self._due.update(pools)
        if self._due and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._flush(),
                                                                name="runlease-pool-waker")

    async def _flush(self) -> None:
        while self._due:
            pools, self._due = sorted(self._due), set()
            try:
                async with self.store.connection() as conn:
                    await conn.execute(
                        "SELECT pg_notify(%(prefix)s || p, p) FROM unnest(%(pools)s::text[]) p",
                        {"prefix": POOL_CHANNEL_PREFIX, "pools": pools})
            except RunleaseError as exc:  # the claimers' poll finds the runs
                log.debug("pool_wakeup_failed pools=%s error=%s", pools, exc)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(self._task, 2)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
