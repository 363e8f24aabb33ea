"""Group acks: the acks of runs that finish together go out in one statement.

While one ack statement is in flight the next acks queue up, and go out
together when it returns (group commit): a busy worker writes one statement
for many runs, an idle one acks each run at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from runlease.db.models import Lease
from runlease.db.store import Rendered, RunStore
from runlease.errors import DatabaseUnavailable
from runlease.services.loop import Service

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Ack:
    lease: Lease
    result: Rendered
    may_write: Callable[[], bool]
    done: asyncio.Future[bool]


class Acker(Service):
    name = "acker"
    cancel_on_stop = True  # stopped after the last run has finished

    def __init__(self, store: RunStore, *, pool: str, max_batch: int = 500) -> None:
        super().__init__()
        self.store = store
        self.pool = pool
        self.max_batch = max_batch
        self._queue: asyncio.Queue[_Ack] = asyncio.Queue()

    def submit(self, lease: Lease, result: Rendered,
               may_write: Callable[[], bool] = lambda: True) -> asyncio.Future[bool]:
        """Queue an ack of a result already rendered (RunStore.render_result,
        so no item can fail the batch it joins); the future says True once
        acked, False if the lease was lost first. `may_write` is asked right
        before each send: an ack whose fence has passed is dropped, not sent.
        Whoever holds the run may also give an ack up by settling the future
        False (Worker._ack does when the lease is lost): a settled ack is
        dropped, never retried."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Ack(lease, result, may_write, done))
        return done

    async def _main(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._flush(batch)

    async def _flush(self, batch: list[_Ack]) -> None:
        delay = 0.05
        while batch := self._sendable(batch):
            try:
                lost = await self.store.ack_many([(a.lease, a.result) for a in batch])
            except DatabaseUnavailable as exc:
                log.warning("ack_retry runs=%d error=%s", len(batch), exc)
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            except Exception as exc:
                if len(batch) > 1:
                    # Whatever went wrong, it must not hold up the other runs:
                    # each is acked on its own, so only a culprit fails.
                    log.warning("ack_batch_failed runs=%d error=%s: acking one by one",
                                len(batch), exc)
                    for one in batch:
                        await self._flush([one])
                    return
                if not batch[0].done.done():
                    batch[0].done.set_exception(exc)
                return
            for a in batch:
                if not a.done.done():
                    a.done.set_result(a.lease.run_id not in lost)
            return

    @staticmethod
    def _sendable(batch: list[_Ack]) -> list[_Ack]:
        keep = []
        for a in batch:
            if a.done.done():
                continue
            if not a.may_write():
                a.done.set_result(False)
                continue
            keep.append(a)
        return keep
