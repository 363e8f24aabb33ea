"""The claim loop: leases runs for the worker's free slots, and no more.

Claims are batched up to the number of free slots, on a connection of their
own, as the worker's current incarnation (none while the lease keeper
registers the next one: the loop waits). A NOTIFY on the pool's channel (or
a freed slot) wakes the loop; with nothing notified it polls with jitter. A
claim that fails is retried with backoff; runs claimed after the drain
began, or as an incarnation that was over by the time the claim answered,
are handed back at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from runlease import metrics, tracing
from runlease.db.models import Lease
from runlease.db.store import stale_writes
from runlease.errors import IncarnationEnded, RunleaseError
from runlease.services.loop import Service, jittered, sleep
from runlease.worker import attempt_trace
from runlease.worker.holder import LeaseHolder
from runlease.worker.incarnation import Incarnation

log = logging.getLogger(__name__)


class ClaimLoop(Service):
    """Claims runs for this worker's free slots as the holder; what it
    claims goes to `start_run`, what it claims once halted goes back."""

    name = "claim-loop"

    def __init__(
        self,
        holder: LeaseHolder,
        *,
        batch: int,
        poll_interval_s: float,
        free_slots: Callable[[], int],
        start_run: Callable[[Lease, float, Incarnation], None],
        wake: asyncio.Event,
        slot_freed: asyncio.Event,
    ) -> None:
        """`start_run(lease, sent, incarnation)` takes each claimed run (sent:
        when the claim was sent, by the holder's clock; incarnation: the one
        it was claimed as, whose lease it lives by). `wake` is set by the
        pool's NOTIFY, `slot_freed` when a run ends."""
        super().__init__()
        self.holder = holder
        self.batch = batch
        self.poll_interval_s = poll_interval_s
        self.free_slots = free_slots
        self.start_run = start_run
        self.wake = wake
        self.slot_freed = slot_freed
        self._db = holder.own_connection("runlease-claim")
        self._retry_s = 0.1

    @property
    def crashed(self) -> bool:
        """Started, and ended by itself (not stopped): /healthz fails."""
        return self._task is not None and self._task.done() and not self.stopping.is_set()

    def halt(self) -> None:
        """Claim no more from now on (the drain): the claim under way, if
        any, finishes, and what it claims is handed back."""
        self.stopping.set()
        self.wake.set()
        self.slot_freed.set()

    async def stop(self, timeout_s: float = 5.0) -> None:
        self.halt()
        await super().stop(timeout_s)

    def abort(self) -> None:
        """Stop at once, the claim under way cancelled (shutdown)."""
        self.halt()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _main(self) -> None:
        try:
            while not self.stopping.is_set():
                if self.free_slots() <= 0:
                    self.slot_freed.clear()
                    await self.slot_freed.wait()
                    continue
                inc = self.holder.current
                if inc is None or inc.over:  # the keeper is registering the next
                    await sleep(self.poll_interval_s, self.holder.registered)
                    continue
                wait_s = await self.run_once()
                if wait_s > 0 and not self.stopping.is_set():
                    await sleep(wait_s, self.wake)
        finally:
            await self.close()

    async def run_once(self) -> float:
        """One claim for the free slots (up to the batch); returns how long to
        wait before the next one, which a NOTIFY cuts short: 0 when every
        slot asked for was filled, the poll interval when the queue ran
        short, the backoff after a failure."""
        n = min(self.free_slots(), self.batch)
        if n <= 0:
            return 0.0
        h = self.holder
        inc = h.current
        if inc is None or inc.over:
            return self.poll_interval_s
        self.wake.clear()
        try:
            conn = await self._db.get()
            sent = h.clock.monotonic()
            leases = await h.store.claim(h.pool, inc.id, n, conn=conn)
        except IncarnationEnded:
            # The database ended it before the keeper noticed: the keeper
            # stops its runs and registers the next.
            inc.end("ended")
            return 0.0
        except (RunleaseError, OSError) as exc:
            delay, self._retry_s = self._retry_s, min(5.0, self._retry_s * 2)
            log.warning("claim_failed error=%s retry_in_s=%.2f", exc, delay)
            await self.close()
            return delay
        self._retry_s = 0.1
        metrics.child(metrics.CLAIM_LATENCY, h.pool).observe(h.clock.monotonic() - sent)
        if leases and (self.stopping.is_set() or inc.over):
            # Claimed while the drain began, or as an incarnation over by now:
            # hand them back at once (a release the database refuses leaves
            # them to the reaper, with the rest of the incarnation's runs).
            try:
                released = await h.store.release(inc.id, [(x.run_id, x.epoch) for x in leases])
            except RunleaseError as exc:
                log.warning("claim_release_failed runs=%d error=%s", len(leases), exc)
                released = {}
            if len(released) < len(leases):
                stale_writes(h.pool, len(leases) - len(released))
            return 0.0
        if tracing.ENABLED and leases:
            await attempt_trace.read_contexts(h.store, leases, conn)
        for lease in leases:
            self.start_run(lease, sent, inc)
        return jittered(self.poll_interval_s) if len(leases) < n else 0.0

    async def close(self) -> None:
        await self._db.close()
