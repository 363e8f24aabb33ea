"""One run on a worker, from claim to outcome.

A RunHandle owns the agent's task. It can be stopped for four reasons, each
ending differently:

    user cancel   token set; the agent may stop by itself; after cancel_grace_s
                  its task is cancelled; tools get SIGTERM, then SIGKILL;
                  -> finalize_cancel (cancelled, never retried)
    drain         the worker is shutting down: task cancelled after the drain
                  grace; -> release (pending now, attempt not charged)
    lease lost    a renewal or a fenced write found the lease gone
    self-fenced   no renewal in time by the worker's own clock
                  -> task cancelled at once, tools SIGKILLed, nothing written
    deadline      the budget's deadline_s passed -> dead, budget_exceeded

Otherwise the agent's own ending decides (see worker/errors.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from runlease import metrics
from runlease.clock import Clock, SystemClock
from runlease.core.bounds import RETRY_AFTER_MAX_S, ResultRefused
from runlease.core.states import ErrorCode, Outcome, RunStatus
from runlease.db.models import Lease
from runlease.db.store import Rendered, RunStore, stale_writes
from runlease.errors import DatabaseUnavailable, LeaseLost
from runlease.worker.context import RunContext
from runlease.worker.errors import BudgetExceeded, FatalError, RetryableError, RunCancelled
from runlease.worker.toolenv import run_vars
from runlease.worker.tools import ToolRunner
from runlease.worker.waits import Flag, first_of

log = logging.getLogger(__name__)

Agent = Callable[[RunContext], Awaitable[dict[str, Any] | None]]
Acker = Callable[["RunHandle", Rendered], Awaitable[bool]]


class StopReason(enum.Enum):
    CANCEL = "cancel"
    DRAIN = "drain"
    LEASE_LOST = Outcome.LEASE_LOST.value
    SELF_FENCED = Outcome.SELF_FENCED.value
    DEADLINE = "deadline"


class RunHandle:
    """One attempt of one run on this worker: its lease, its agent task, its
    tools, and why it stops. Every write for the attempt goes through its own
    handle, never through a lookup by run id: after a reclaim, two handles of
    one run exist (the old one unwinding, the new one waiting for it)."""

    def __init__(
        self,
        lease: Lease,
        *,
        claimed_at: float,
        lease_s: float,
        margin_s: float,
        cancel_grace_s: float,
        kill_grace_s: float,
        previous: RunHandle | None = None,
        tool_grant: frozenset[str] = frozenset(),
        clock: Clock | None = None,
    ) -> None:
        self.lease = lease
        # The worker's monotonic clock, which alone judges the fence (a
        # ManualClock in tests, so the fence is driven without sleeping).
        self.clock: Clock = clock or SystemClock()
        self.claimed_at = claimed_at
        # Self-fencing: stop before the lease could expire. The claim (or the
        # renewal) was sent at `sent`; the database set locked_until after that.
        self.lease_s = lease_s
        self.margin_s = margin_s
        self.fence_at = claimed_at + lease_s - margin_s
        # The run id as text, made once: task names and the tools' env use it.
        self.rid = str(lease.run_id)
        self.cancel = asyncio.Event()
        self.cancel_grace_s = cancel_grace_s
        self.tools = ToolRunner(self.cancel, kill_grace_s, grant=tool_grant,
                                run_env=run_vars(self.rid, lease.run.attempts, lease.epoch))
        self.reason: StopReason | None = None
        self.task: asyncio.Task[Any] | None = None
        self.finished = Flag()
        # Set when this attempt has really ended (an abandoned agent task
        # included): only then may a newer attempt of the run start.
        self.ended = Flag()
        # The older attempt of the same run this one waits for, if any.
        self.previous = previous
        # Set by every stop and cancel: wakes an attempt waiting for `previous`.
        self.stopping = Flag()
        # Resolved when the lease is lost or self-fenced: whatever waits on the
        # run stops waiting. A future, not an Event, so racing it costs no task.
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Set once the final write (ack, nack...) is under way: a renewal that
        # finds no row then means that write committed, not that the lease was lost.
        self.closing = False
        self._killing: asyncio.Task[None] | None = None

    @property
    def run_id(self) -> Any:
        return self.lease.run_id

    @property
    def pool(self) -> str:
        return self.lease.run.pool

    @property
    def writes_allowed(self) -> bool:
        return self.reason not in (StopReason.LEASE_LOST, StopReason.SELF_FENCED)

    @property
    def lease_lost(self) -> bool:
        """The lease is gone (lost or self-fenced): nothing more is written."""
        return not self.writes_allowed

    def may_write(self) -> bool:
        """Checked before every write: False once the lease is lost, or once
        the fence deadline has passed by this worker's own clock (then the
        attempt is self-fenced here, whoever noticed first)."""
        if not self.writes_allowed:
            return False
        now = self.clock.monotonic()
        if now >= self.fence_at:
            self.self_fence(now)
            return False
        return True

    def self_fence(self, now: float) -> None:
        if not self.writes_allowed:
            return
        metrics.child(metrics.SELF_FENCED, self.pool).inc()
        log.error("run_self_fenced run_id=%s since_renewal_s=%.2f", self.run_id,
                  now - (self.fence_at - self.lease_s + self.margin_s))
        self.stop(StopReason.SELF_FENCED)

    def renewed(self, sent_at: float) -> None:
        self.fence_at = sent_at + self.lease_s - self.margin_s

    def request_cancel(self) -> None:
        """The user's Stop reached this worker (NOTIFY or the heartbeat flag)."""
        if self.cancel.is_set() or self.reason is not None:
            return
        self.reason = StopReason.CANCEL
        self.cancel.set()
        self.stopping.set()
        metrics.child(metrics.CANCELS, self.pool).inc()
        log.info("run_cancel_requested run_id=%s", self.run_id)
        if self.task is not None:
            asyncio.get_running_loop().call_later(self.cancel_grace_s, self._cancel_task)

    def stop(self, reason: StopReason) -> None:
        """Stop now: drain, lost lease, self-fencing or the deadline."""
        if self.reason in (StopReason.LEASE_LOST, StopReason.SELF_FENCED):
            return
        hard = reason in (StopReason.LEASE_LOST, StopReason.SELF_FENCED)
        if self.reason is None or hard:
            self.reason = reason
        self.stopping.set()
        if hard:
            # Kill the tools now, not when the agent's task gets round to it:
            # the task may be stuck on a dead socket.
            self.tools.hard = True
            if not self.lost.done():
                self.lost.set_result(None)
            self._killing = asyncio.ensure_future(self.tools.kill_all())
        log.log(logging.WARNING if reason != StopReason.DRAIN else logging.INFO,
                "run_stopping run_id=%s reason=%s", self.run_id, reason.value)
        self._cancel_task()

    def _cancel_task(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


class Runner:
    """Executes runs: agent task, outcome, the fenced write that ends it."""

    def __init__(
        self,
        store: RunStore,
        agent: Agent,
        *,
        ack: Acker,
    ) -> None:
        self.store = store
        self.agent = agent
        self.ack = ack

    async def execute(self, handle: RunHandle) -> None:
        """Run the agent and write the outcome; never raises."""
        run = handle.lease.run
        outcome = Outcome.UNKNOWN
        try:
            outcome = await self._execute(handle)
        except LeaseLost:
            outcome = self._lost(handle)
        except Exception:
            log.exception("run_execute_failed run_id=%s", run.id)
        finally:
            if handle.tools.live:
                await handle.tools.kill_all()
            if handle._killing is not None:
                await handle._killing
            metrics.child(metrics.RUNS_FINISHED, run.pool, outcome).inc()
            metrics.child(metrics.RUN_DURATION, run.pool, outcome).observe(
                handle.clock.monotonic() - handle.claimed_at)
            # A run that simply succeeded is logged at DEBUG: a busy worker
            # finishes thousands a second, and metrics count them.
            log.log(logging.DEBUG if outcome == Outcome.DONE else logging.INFO,
                    "run_finished run_id=%s tenant=%s attempt=%s outcome=%s", run.id,
                    run.tenant_id, run.attempts, outcome)
            handle.finished.set()

    @staticmethod
    def _lost(handle: RunHandle) -> Outcome:
        if handle.writes_allowed:
            # Found by a fenced write (an event, a step, the ack...), not by a
            # renewal or the fence, which count their own.
            metrics.child(metrics.LEASES_LOST, handle.pool).inc()
            log.error("lease_lost run_id=%s epoch=%s", handle.run_id, handle.lease.epoch)
            handle.stop(StopReason.LEASE_LOST)
        assert handle.reason is not None
        return Outcome(handle.reason.value)

    async def _execute(self, handle: RunHandle) -> Outcome:
        lease = handle.lease
        if handle.previous is not None and not handle.previous.ended.is_set():
            # This worker claimed the run again while its older attempt still
            # unwinds: one attempt at a time, so this one starts when that one
            # has ended (its lease is renewed meanwhile), or stops if told to.
            log.warning("run_waiting_for_previous_attempt run_id=%s epoch=%s", lease.run_id,
                        lease.epoch)
            stopping = asyncio.ensure_future(handle.stopping.wait())
            try:
                await asyncio.wait({asyncio.ensure_future(handle.previous.ended.wait()),
                                    stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
            if handle.reason is not None:
                return await self._finish(handle, None, None)
        handle.previous = None  # nothing more to wait for; let it be collected
        ctx = RunContext(lease, self.store, cancel=handle.cancel, tools=handle.tools,
                         started=handle.claimed_at, fence=handle, clock=handle.clock)
        deadline = None
        if ctx.budget.deadline_s is not None:
            deadline = asyncio.get_running_loop().call_later(
                max(0.0, ctx.budget.deadline_s - (handle.clock.monotonic() - handle.claimed_at)),
                handle.stop, StopReason.DEADLINE)
        result: Any = None
        error: BaseException | None = None
        agent_task: asyncio.Task[Any]
        agent_task = asyncio.create_task(self._agent(ctx), name="run-" + handle.rid)
        handle.task = agent_task
        if handle.cancel.is_set():
            agent_task.cancel()
        try:
            result = await self._until_lost(handle, agent_task, grace_s=1.0)
        except asyncio.CancelledError:
            if handle.reason is None:  # the worker itself is being cancelled
                raise
            error = None
        except Exception as exc:
            error = exc
        finally:
            if deadline is not None:
                deadline.cancel()
            with contextlib.suppress(Exception):
                await ctx.flush()
            await ctx.close()
        return await self._finish(handle, result, error)

    @staticmethod
    async def _until_lost(handle: RunHandle, task: asyncio.Future[Any], grace_s: float) -> Any:
        """Await task, unless the lease is lost first: then give it grace_s to
        wind down and abandon it (a write stuck on a dead socket must not hold
        the slot), raising LeaseLost."""
        if not task.done() and not handle.lost.done():
            await first_of(task, handle.lost)
        if not task.done():
            # One cancellation, not a second one into the agent's own cleanup
            # (stop() may have cancelled it already).
            if not (isinstance(task, asyncio.Task) and task.cancelling()):
                task.cancel()
            await asyncio.wait({task}, timeout=grace_s)
            if not task.done():
                log.error("run_abandoned run_id=%s: its task did not stop", handle.run_id)
                raise LeaseLost(handle.run_id, handle.lease.epoch)
        return task.result()

    async def _agent(self, ctx: RunContext) -> Any:
        result = await self.agent(ctx)
        await ctx.flush()
        return result

    async def _finish(self, handle: RunHandle, result: Any,
                      error: BaseException | None) -> Outcome:
        lease = handle.lease
        reason = handle.reason
        handle.closing = True
        if isinstance(error, LeaseLost) or not handle.writes_allowed:
            return self._lost(handle)
        if reason == StopReason.DRAIN:
            released = await self._retry(handle, lambda: self.store.release(
                lease.worker, [(lease.run_id, lease.epoch)]))
            if lease.run_id not in released:
                stale_writes(handle.pool)
                return self._lost(handle)
            return Outcome.RELEASED
        if reason == StopReason.CANCEL or isinstance(error, RunCancelled):
            latency = await self._retry(handle, lambda: self.store.finalize_cancel(lease))
            metrics.CANCEL_LATENCY.labels(handle.pool).observe(latency)
            return Outcome.CANCELLED
        if reason == StopReason.DEADLINE or isinstance(error, BudgetExceeded):
            message = str(error) if error else "deadline exceeded"
            await self._retry(handle, lambda: self.store.fail(
                lease, ErrorCode.BUDGET_EXCEEDED.value, message))
            return Outcome.DEAD
        if error is None:
            try:
                rendered = Rendered(self.store.render_result(result))
            except ResultRefused as exc:
                # This run's result alone is refused; it never joins a batch.
                refused = (exc.code, f"the run's result {exc.message}")
                await self._retry(handle, lambda: self.store.fail(lease, *refused))
                return Outcome.DEAD
            if not handle.may_write() or not await self.ack(handle, rendered):
                return self._lost(handle)
            return Outcome.DONE
        if isinstance(error, FatalError):
            await self._retry(handle, lambda: self.store.fail(lease, error.code, str(error)))
            return Outcome.DEAD
        retry_after: float | None = None
        if isinstance(error, RetryableError):
            code, message = error.code, str(error)
            if error.retry_after_s is not None:
                retry_after = min(max(0.0, error.retry_after_s), RETRY_AFTER_MAX_S)
        else:
            code = ErrorCode.UNEXPECTED.value
            message = "".join(traceback.format_exception_only(error)).strip()
            tb = traceback.extract_tb(error.__traceback__)[-3:]
            message += "\n" + "".join(traceback.format_list(tb))
            log.warning("run_raised run_id=%s error=%s", lease.run_id, message.splitlines()[0])
        status = await self._retry(handle, lambda: self.store.nack(
            lease, code, message, retry_after_s=retry_after))
        return Outcome.RETRYING if status == RunStatus.PENDING else Outcome(status.value)

    async def _retry(self, handle: RunHandle, op: Callable[[], Awaitable[Any]]) -> Any:
        """A write that rides out a database outage until the fence deadline."""
        delay = 0.1
        while True:
            if not handle.may_write():
                raise LeaseLost(handle.run_id, handle.lease.epoch)
            try:
                return await self._until_lost(handle, asyncio.ensure_future(op()), grace_s=0)
            except DatabaseUnavailable as exc:
                if not handle.may_write():
                    raise LeaseLost(handle.run_id, handle.lease.epoch) from exc
                log.warning("run_write_retry run_id=%s error=%s", handle.run_id, exc)
                left_s = handle.fence_at - handle.clock.monotonic()
                await asyncio.sleep(min(delay, max(0.0, left_s)))
                delay = min(2.0, delay * 2)
