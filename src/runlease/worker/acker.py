"""Group acks: the acks of runs that finish together go out in one statement.

While one ack statement is in flight the next acks queue up, and go out
together when it returns (group commit): a busy worker writes one statement
for many runs, an idle one acks each run at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from runlease import metrics
from runlease.db.models import Lease
from runlease.db.store import RunStore
from runlease.errors import DatabaseUnavailable
from runlease.services.loop import Service

log = logging.getLogger(__name__)


class Acker(Service):
    name = "acker"
    cancel_on_stop = True  # stopped after the last run has finished

    def __init__(self, store: RunStore, *, pool: str, max_batch: int = 500) -> None:
        super().__init__()
        self.store = store
        self.pool = pool
        self.max_batch = max_batch
        self._queue: asyncio.Queue[tuple[Lease, Any, asyncio.Future[bool]]] = (
            asyncio.Queue())

    def submit(self, lease: Lease, result: Any) -> asyncio.Future[bool]:
        """Queue an ack; the future says True once acked, False if the lease was
        lost first. Whoever holds the run gives an ack up by settling the
        future False (Worker._ack does, when the run's lease is lost or fenced):
        a settled ack is dropped, never retried."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((lease, result, done))
        return done

    async def _main(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._flush(batch)

    async def _flush(self, batch: list[tuple[Lease, Any, asyncio.Future[bool]]]) -> None:
        delay = 0.05
        while batch := [item for item in batch if not item[2].done()]:
            try:
                lost = await self.store.ack_many([(lease, result) for lease, result, _ in batch])
            except DatabaseUnavailable as exc:
                log.warning("ack_retry runs=%d error=%s", len(batch), exc)
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            except Exception as exc:  # handed to every waiter
                for *_, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                return
            if lost:
                metrics.STALE_WRITES.labels(self.pool).inc(len(lost))
            for lease, _, done in batch:
                if not done.done():
                    done.set_result(lease.run_id not in lost)
            return
