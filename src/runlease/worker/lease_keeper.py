"""The lease keeper: this worker's incarnation, registered, renewed and fenced.

A run's lease belongs to the worker incarnation that claimed it
(worker/incarnation.py): one heartbeat statement per interval renews the
incarnation's row, and with it every lease the worker holds, whatever their
number. The same statement tells the worker of cancels of its runs that a
NOTIFY may have missed.

Self-fencing, by the worker's own monotonic clock: each renewal moves the
incarnation's fence to when its send time plus the lease, less a margin,
passes. When the database cannot be reached at all, every run stops at the
fence, before any lease could expire and another worker claim the run. When
a renewal finds no live row (the reaper ended the incarnation: it stopped
renewing in time), every run it held stops at once, as lost. Either way the
incarnation is over for good, and the keeper registers the next one for
what the worker claims from then on.

An attempt that ended without its ending written (the worker's own failure:
outcome UNKNOWN) would stay leased by a live incarnation with nobody running
it: the keeper nacks it after its next renewal (worker_failed; retried with
backoff, dead at max_attempts), and should even that be refused, ends the
incarnation so the reaper requeues everything it held.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from runlease import metrics
from runlease.core.states import ErrorCode
from runlease.db.store import Registration, stale_writes
from runlease.db.workers import Renewal
from runlease.errors import DatabaseUnavailable, LeaseLost, RunleaseError
from runlease.services.loop import Service, sleep
from runlease.worker.handle import RunHandle, StopReason
from runlease.worker.holder import LeaseHolder
from runlease.worker.incarnation import Incarnation, incarnation_id

log = logging.getLogger(__name__)

UNSETTLED_MESSAGE = "the worker could not record how this attempt ended"


class LeaseKeeper(Service):
    """Registers, renews and fences the holder's incarnation; stops the runs
    of an incarnation that is over (through `on_lost` when the database
    ended it) and registers the next."""

    name = "lease-keeper"

    def __init__(
        self,
        holder: LeaseHolder,
        runs: Collection[RunHandle],
        *,
        interval_s: float,
        on_lost: Callable[[RunHandle, StopReason], None],
        concurrency: int = 0,
    ) -> None:
        super().__init__()
        self.holder = holder
        self.clock = holder.clock
        self.runs = runs
        self.interval_s = interval_s
        self.on_lost = on_lost
        self.concurrency = concurrency
        self._db = holder.own_connection("runlease-heartbeat")
        self.last_loop = self.clock.monotonic()  # for /healthz
        self.wakeup = asyncio.Event()
        self.max_delay_s = 0.0  # the longest stall seen, for tests and /healthz
        # Attempts that ended without their ending written (see the module).
        self._unsettled: list[RunHandle] = []

    async def stop(self, timeout_s: float = 5.0) -> None:
        self.wakeup.set()
        await super().stop(timeout_s)

    @property
    def alive(self) -> bool:
        return self.running and self.clock.monotonic() - self.last_loop < 3 * self.interval_s + 5

    def registration(self, worker: str) -> Registration:
        return Registration(worker, self.holder.pool, self.concurrency)

    # -- the loop ---------------------------------------------------------------------

    async def _main(self) -> None:
        # The renewal runs as its own task: a statement stuck on a cut network
        # must never delay the fence, which this loop checks on time.
        now = self.clock.monotonic()
        next_beat = now if self.holder.current is None else now + self.interval_s
        beat: asyncio.Task[bool] | None = None
        failed = False
        try:
            while not self.stopping.is_set():
                self.last_loop = now = self.clock.monotonic()
                if beat is not None and beat.done():
                    ok = not beat.cancelled() and beat.result()
                    beat = None
                    failed = not ok
                    # After a failure, try again soon: the fence deadline approaches.
                    next_beat = now + (self.interval_s if ok else min(1.0, self.interval_s))
                self.fence(now)
                inc = self.holder.current
                # An incarnation that just ended is replaced at once; after a
                # failed try (the database unreachable), only when due: a
                # retry at every wake-up spun a core while the database was gone.
                if beat is None and (now >= next_beat or (inc is None and not failed)):
                    beat = asyncio.create_task(self.beat(), name="heartbeat")
                    beat.add_done_callback(lambda _: self.wakeup.set())
                    next_beat = now + self.interval_s
                deadline = inc.fence_at if inc is not None and not inc.over else now + 3600
                wake_at = min(next_beat if beat is None else now + self.interval_s, deadline)
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

    # -- the incarnation ---------------------------------------------------------------

    def fence(self, now: float) -> None:
        """End the incarnation whose leases could expire before another renewal."""
        inc = self.holder.current
        if inc is not None and not inc.over and now >= inc.fence_at:
            inc.end("self_fenced")

    def _over(self, inc: Incarnation) -> None:
        """An incarnation is over (Incarnation.end calls this, whoever noticed):
        every run it held stops, and the next incarnation is registered soon."""
        if self.holder.current is inc:
            self.holder.current = None
            self.holder.registered.clear()
        fenced = inc.reason == "self_fenced"
        stopped = 0
        for handle in list(self.runs):
            if handle.incarnation is not inc or not handle.writes_allowed:
                continue
            stopped += 1
            if fenced:
                metrics.child(metrics.SELF_FENCED, handle.pool).inc()
                # The runbook's alert line, per run, as when a run's own
                # write found the fence passed (RunHandle.self_fence).
                log.error("run_self_fenced run_id=%s worker=%s", handle.run_id, inc.id)
                handle.stop(StopReason.SELF_FENCED)
            elif not handle.closing:  # an ending that committed first lost nothing
                metrics.child(metrics.LEASES_LOST, handle.pool).inc()
                self.on_lost(handle, StopReason.LEASE_LOST)
        if inc.reason == "ended" and stopped:
            # The database refused the incarnation (a renewal or a claim,
            # whichever came first) while it still had runs writing: one
            # stale write (a run's own refused write counted itself already,
            # and stopped it).
            stale_writes(self.holder.pool)
        self._unsettled = [h for h in self._unsettled if h.incarnation is not inc]
        log.error("incarnation_stopped_runs worker=%s reason=%s runs=%d", inc.id, inc.reason,
                  stopped)
        self.wakeup.set()

    async def register(self) -> bool:
        """Register a new incarnation and make it the holder's current one;
        False when the database did not take it (the loop tries again soon)."""
        worker = incarnation_id(self.holder.identity)
        sent = self.clock.monotonic()
        try:
            conn = await self._db.get()
            await asyncio.wait_for(self.holder.store.register_worker(
                self.registration(worker), lease_s=self.holder.lease_s, conn=conn),
                max(1.0, self.interval_s))
        except (RunleaseError, OSError, TimeoutError) as exc:
            log.warning("worker_register_failed worker=%s error=%s", worker,
                        str(exc) or type(exc).__name__)
            self._db.abandon()
            return False
        self.holder.current = Incarnation(worker, sent + self.holder.fence_after_s,
                                          on_over=self._over)
        self.holder.registered.set()
        log.info("incarnation_registered worker=%s lease_s=%s", worker, self.holder.lease_s)
        return True

    async def beat(self) -> bool:
        """One renewal of the incarnation (or the registration of a new one);
        False when the database did not answer."""
        inc = self.holder.current
        if inc is None or inc.over:
            return await self.register()
        sent = self.clock.monotonic()
        # Never wait past the fence: by then it has acted, and a statement
        # stuck on a dead socket is abandoned, not awaited.
        budget = max(0.1, inc.fence_at - sent)
        call = asyncio.ensure_future(self._renew(inc))
        done, _ = await asyncio.wait({call}, timeout=budget)
        error: BaseException | None
        if not done:
            call.cancel()
            error = TimeoutError(f"no answer in {budget:.1f} s")
        else:
            error = call.exception()
        if error is not None:
            metrics.HEARTBEATS.labels(self.holder.pool, "failed").inc()
            log.warning("heartbeat_failed worker=%s runs=%d error=%s", inc.id, len(self.runs),
                        str(error) or type(error).__name__)
            self._db.abandon()
            return False
        renewal = call.result()
        if renewal is None:
            # Ended in the database (the reaper found it expired): its runs
            # were, or will be, requeued. Nothing more is written for them.
            metrics.HEARTBEATS.labels(self.holder.pool, "lost").inc()
            inc.end("ended")
            return await self.register()
        metrics.HEARTBEATS.labels(self.holder.pool, "ok").inc()
        inc.renewed(sent + self.holder.fence_after_s)
        self._cancels(inc, renewal)
        if self._unsettled:
            await self._settle(inc)
        return True

    async def _renew(self, inc: Incarnation) -> Renewal | None:
        conn = await self._db.get()
        held = sum(1 for h in self.runs if h.incarnation is inc and h.writes_allowed)
        return await self.holder.store.heartbeat(
            self.registration(inc.id), lease_s=self.holder.lease_s, runs_held=held, conn=conn)

    def _cancels(self, inc: Incarnation, renewal: Renewal) -> None:
        if not renewal.cancel_requested:
            return
        for handle in list(self.runs):
            if handle.incarnation is inc and handle.run_id in renewal.cancel_requested:
                handle.request_cancel()

    # -- attempts that ended without their ending written -------------------------------

    def unsettled(self, handle: RunHandle) -> None:
        """`handle` ended without its ending written; its run is still leased
        by a live incarnation: nack it at the next renewal."""
        if handle.writes_allowed and not handle.incarnation.over:
            self._unsettled.append(handle)
            self.wakeup.set()

    async def _settle(self, inc: Incarnation) -> None:
        while self._unsettled:
            handle = self._unsettled[0]
            if handle.incarnation is not inc:
                self._unsettled.pop(0)
                continue
            try:
                conn = await self._db.get()
                await self.holder.store.nack(handle.lease, ErrorCode.WORKER_FAILED.value,
                                             UNSETTLED_MESSAGE, conn=conn)
            except LeaseLost:
                pass  # its ending did land, or the lease went: nothing leased by nobody
            except DatabaseUnavailable as exc:
                log.warning("unsettled_nack_retry run_id=%s error=%s", handle.run_id, exc)
                self._db.abandon()
                return  # at the next renewal
            except Exception:
                # Its run cannot be handed back: rather than leave it leased
                # by a live incarnation nobody runs it for, end the
                # incarnation, and the reaper requeues everything it held.
                log.exception("unsettled_nack_failed run_id=%s", handle.run_id)
                self._unsettled.pop(0)
                inc.end("unsettled")
                return
            else:
                log.warning("run_unsettled_nacked run_id=%s epoch=%s", handle.run_id,
                            handle.lease.epoch)
            self._unsettled.pop(0)
