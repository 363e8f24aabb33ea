"""The lease keeper: one heartbeat statement per interval for every run this
worker holds, and self-fencing by the worker's own monotonic clock.

A run whose renewal returns no row has lost its lease: it is stopped at once
and nothing more is written for it. When the database cannot be reached at
all, each run is stopped when its lease *could* expire — last successful
renewal (by when the statement was sent) + lease - margin — so before any
other worker could claim it.

The same statement renews the worker's row in the workers registry; a
worker holding nothing renews that row alone, so the reaper (which looks
for expired leases among the runs of workers whose row expired) and the
console see it alive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any

from runlease import metrics
from runlease.db.models import HeartbeatResult
from runlease.db.store import Registration, stale_writes
from runlease.services.loop import Service, sleep
from runlease.worker.handle import RunHandle, StopReason
from runlease.worker.holder import LeaseHolder

log = logging.getLogger(__name__)


class LeaseKeeper(Service):
    """Renews the leases of `runs` (and the worker's registry row) as the
    holder, and stops each run by its own fence when renewals fail."""

    name = "lease-keeper"

    def __init__(
        self,
        holder: LeaseHolder,
        runs: Collection[RunHandle],
        *,
        interval_s: float,
        on_lost: Callable[[RunHandle, StopReason], None],
        registry: Registration | None = None,
    ) -> None:
        super().__init__()
        self.holder = holder
        self.clock = holder.clock
        self.runs = runs
        self.interval_s = interval_s
        self.on_lost = on_lost
        self.registry = registry
        self._db = holder.own_connection("runlease-heartbeat")
        self.last_loop = self.clock.monotonic()  # for /healthz
        self.wakeup = asyncio.Event()
        self.max_delay_s = 0.0  # the longest stall seen, for tests and /healthz

    async def stop(self, timeout_s: float = 5.0) -> None:
        self.wakeup.set()
        await super().stop(timeout_s)

    @property
    def alive(self) -> bool:
        return self.running and self.clock.monotonic() - self.last_loop < 3 * self.interval_s + 5

    async def _main(self) -> None:
        # The renewal runs as its own task: a statement stuck on a cut network
        # must never delay the fence, which this loop checks on time.
        next_beat = self.clock.monotonic() + self.interval_s
        beat: asyncio.Task[bool] | None = None
        try:
            while not self.stopping.is_set():
                self.last_loop = now = self.clock.monotonic()
                if beat is not None and beat.done():
                    ok = not beat.cancelled() and beat.result()
                    beat = None
                    # After a failure, try again soon: the fence deadline approaches.
                    next_beat = now + (self.interval_s if ok else min(1.0, self.interval_s))
                self.fence(now)
                if beat is None and now >= next_beat:
                    beat = asyncio.create_task(self.beat(), name="heartbeat")
                    beat.add_done_callback(lambda _: self.wakeup.set())
                    next_beat = now + self.interval_s
                deadlines = [h.fence_at for h in self.runs if h.writes_allowed]
                wake_at = min([next_beat, *deadlines]) if beat is None else min(
                    [now + self.interval_s, *deadlines])
                self.wakeup.clear()
                if not self.stopping.is_set():
                    await sleep(max(0.0, wake_at - self.clock.monotonic()), self.wakeup)
                    # Due (or past due) however it woke: how late it is, is
                    # how long the loop was kept from it.
                    late = self.clock.monotonic() - wake_at
                    if late >= 0:
                        self.observe_delay(late)
        finally:
            if beat is not None:
                beat.cancel()
            await self._db.close(1.0)

    def observe_delay(self, late_s: float) -> None:
        """The keeper woke late_s after it meant to: the event loop was busy
        elsewhere. Exported and logged, so a starved heartbeat is never silent;
        the fence that follows judges the runs by the clock all the same."""
        late_s = max(0.0, late_s)
        self.max_delay_s = max(self.max_delay_s, late_s)
        metrics.child(metrics.HEARTBEAT_DELAY, self.holder.pool).observe(late_s)
        if late_s >= max(0.5, self.interval_s / 2):
            log.warning("heartbeat_delayed late_s=%.2f interval_s=%s runs=%d: the event loop "
                        "was blocked", late_s, self.interval_s, len(self.runs))

    def fence(self, now: float) -> None:
        """Stop every run whose lease could expire before another renewal."""
        for handle in list(self.runs):
            if handle.writes_allowed and now >= handle.fence_at:
                handle.self_fence(now)

    async def beat(self) -> bool:
        """One renewal of everything held; False when the database did not answer."""
        held = {h.run_id: h for h in self.runs if h.writes_allowed}
        if not held and self.registry is None:
            return True
        sent = self.clock.monotonic()
        # Never wait past the earliest fence deadline: by then the fence has
        # acted, and a statement stuck on a dead socket is abandoned, not awaited.
        budget = max(0.1, min((h.fence_at for h in held.values()),
                              default=sent + self.interval_s) - sent)
        call = asyncio.ensure_future(self._renew(held))
        done, _ = await asyncio.wait({call}, timeout=budget)
        error: BaseException | None
        if not done:
            call.cancel()
            error = TimeoutError(f"no answer in {budget:.1f} s")
        else:
            error = call.exception()
        if error is not None and not held:
            log.warning("worker_beat_failed error=%s", str(error) or type(error).__name__)
            self._db.abandon()
            return False
        if error is not None:
            metrics.HEARTBEATS.labels(self.holder.pool, "failed").inc()
            log.warning("heartbeat_failed runs=%d error=%s", len(held),
                        str(error) or type(error).__name__)
            self._db.abandon()
            return False
        result = call.result()
        if not held:
            return True
        metrics.HEARTBEATS.labels(self.holder.pool, "ok").inc()
        for run_id in result.held:
            held[run_id].renewed(sent)
        for run_id in result.lost:
            handle = held[run_id]
            if handle.closing:
                continue  # its ack (or nack...) committed first: nothing was lost
            metrics.child(metrics.LEASES_LOST, self.holder.pool).inc()
            stale_writes(self.holder.pool)  # the renewal was refused
            log.error("lease_lost run_id=%s epoch=%s", run_id, handle.lease.epoch)
            self.on_lost(handle, StopReason.LEASE_LOST)
        for run_id in result.cancel_requested:
            held[run_id].request_cancel()
        return True

    async def _renew(self, held: dict[Any, RunHandle]) -> HeartbeatResult:
        conn = await self._db.get()
        h = self.holder
        return await h.store.heartbeat(
            h.worker, [(i, x.lease.epoch) for i, x in held.items()], lease_s=h.lease_s,
            registry=self.registry, conn=conn)
