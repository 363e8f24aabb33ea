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
    deadline      the budget's deadline_s (since submit) passed -> dead, budget_exceeded

Otherwise the agent's own ending decides (see worker/errors.py); an agent
that awaits ctx.wait_children() while a child is unfinished ends the attempt
waiting (back to pending, the attempt not charged, resumed when the children
are done: worker/children.py); one that awaits ctx.wait_for_input() with no
answer yet ends it `waiting` for a person (worker/humans.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from runlease import metrics, tracing
from runlease.core.bounds import RETRY_AFTER_MAX_S, ResultRefused
from runlease.core.states import ErrorCode, Outcome, RunStatus
from runlease.db.store import Rendered, RunStore, stale_writes
from runlease.errors import DatabaseUnavailable, LeaseLost
from runlease.worker import attempt_trace
from runlease.worker.children import WaitForChildren
from runlease.worker.context import RunContext
from runlease.worker.errors import BudgetExceeded, FatalError, RetryableError, RunCancelled
from runlease.worker.handle import RunHandle, StopReason
from runlease.worker.humans import WaitForInput
from runlease.worker.waits import first_of

log = logging.getLogger(__name__)

Agent = Callable[[RunContext], Awaitable[dict[str, Any] | None]]
Acker = Callable[[RunHandle, Rendered], "asyncio.Future[bool]"]


class Runner:
    """Executes runs: agent task, outcome, the fenced write that ends it.

    A run whose agent simply returns needs no task besides its agent's: its
    ending is done in callbacks (render the result, queue the ack, record the
    outcome when the ack answers). Every other ending (an error, a stop, a
    lost lease, a refused result, a newer attempt waiting for an older one)
    goes the full way in a task of its own. Either way `ended(handle)` is
    called once, when the attempt has really ended."""

    def __init__(
        self,
        store: RunStore,
        agent: Agent,
        *,
        ack: Acker,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        ended: Callable[[RunHandle], None],
    ) -> None:
        """`ack(handle, result)` queues the ack (its future: True once acked,
        False if the lease was lost); `spawn` runs a coroutine as a task the
        worker owns."""
        self.store = store
        self.agent = agent
        self.ack = ack
        self.spawn = spawn
        self.ended = ended

    def launch(self, handle: RunHandle) -> None:
        """Start an attempt (see the class docstring)."""
        if handle.previous is not None and not handle.previous.ended.is_set():
            self.spawn(self._whole(handle))
            return
        ctx, task, deadline = self._start_agent(handle)

        def agent_done(_: object) -> None:
            if handle.settled:
                return  # a lost lease took the full way already
            handle.settled = True
            # The callback points at the handle that holds the future: a
            # cycle only the collector would free, for every run.
            handle.lost.remove_done_callback(lost)
            if deadline is not None:
                deadline.cancel()
            if not self._quick_end(handle, ctx, task):
                self.spawn(self._rest(handle, ctx, task, None))

        def lost(_: object) -> None:
            if not handle.settled and not task.done():
                handle.settled = True  # the agent may not stop: give it grace, then abandon
                self.spawn(self._rest(handle, ctx, task, deadline))

        task.add_done_callback(agent_done)
        handle.lost.add_done_callback(lost)

    def _quick_end(self, handle: RunHandle, ctx: RunContext, task: asyncio.Task[Any]) -> bool:
        """The agent returned, nothing stopped the run and nothing is left to
        write but the ack: queue it, and record the outcome when it answers.
        False: the full way, please."""
        if (task.cancelled() or task.exception() is not None or handle.reason is not None
                or not ctx.idle or handle.tools.live or handle._killing is not None):
            return False
        try:
            rendered = Rendered(self.store.render_result(task.result()))
        except ResultRefused:
            return False
        handle.closing = True
        if not handle.may_write():
            self._conclude(handle, self._lost(handle))
            return True

        def acked(done: asyncio.Future[bool]) -> None:
            outcome = Outcome.UNKNOWN
            if done.cancelled():
                log.error("run_execute_failed run_id=%s: ack cancelled", handle.run_id)
            elif (error := done.exception()) is not None:
                log.error("run_execute_failed run_id=%s", handle.run_id, exc_info=error)
            else:
                outcome = Outcome.DONE if done.result() else self._lost(handle)
            self._conclude(handle, outcome)

        self.ack(handle, rendered).add_done_callback(acked)
        return True

    def _conclude(self, handle: RunHandle, outcome: Outcome) -> None:
        """Record the quick ending's outcome and end the attempt (after its
        tools, if a lost lease is killing them)."""
        if handle.tools.live or handle._killing is not None:
            self.spawn(self._tools_then_end(handle, outcome))
        else:
            self._record(handle, outcome)
            self.ended(handle)

    async def _tools_then_end(self, handle: RunHandle, outcome: Outcome) -> None:
        try:
            await self._end_tools(handle)
        finally:
            self._record(handle, outcome)
            self.ended(handle)

    async def _whole(self, handle: RunHandle) -> None:
        """The full way, from the start (a newer attempt waiting for an older one)."""
        try:
            await self.execute(handle)
            if handle.task is not None and not handle.task.done():
                # Abandoned: its agent ignored cancellation. It still runs, so
                # it keeps its slot (and a newer attempt of the run waits) until
                # it really ends.
                await asyncio.wait({handle.task})
        finally:
            self.ended(handle)

    async def _rest(self, handle: RunHandle, ctx: RunContext, task: asyncio.Task[Any],
                    deadline: asyncio.TimerHandle | None) -> None:
        """The full way, once the agent's task has ended or the lease is lost."""
        try:
            await self._guarded(handle, self._after_agent(handle, ctx, task, deadline))
            if not task.done():
                await asyncio.wait({task})  # abandoned: it keeps its slot until it ends
        finally:
            self.ended(handle)

    async def execute(self, handle: RunHandle) -> None:
        """Run the agent and write the outcome; never raises."""
        await self._guarded(handle, self._execute(handle))

    async def _guarded(self, handle: RunHandle, ending: Awaitable[Outcome]) -> None:
        outcome = Outcome.UNKNOWN
        try:
            outcome = await ending
        except LeaseLost:
            outcome = self._lost(handle)
        except Exception:
            log.exception("run_execute_failed run_id=%s", handle.run_id)
        finally:
            await self._end_tools(handle)
            self._record(handle, outcome)

    @staticmethod
    async def _end_tools(handle: RunHandle) -> None:
        if handle.tools.live:
            await handle.tools.kill_all()
        if handle._killing is not None:
            await handle._killing

    @staticmethod
    def _record(handle: RunHandle, outcome: Outcome) -> None:
        run = handle.lease.run
        metrics.child(metrics.RUNS_FINISHED, run.pool, outcome).inc()
        metrics.child(metrics.RUN_DURATION, run.pool, outcome).observe(
            handle.terms.clock.monotonic() - handle.claimed_at)
        # A run that simply succeeded is logged at DEBUG: a busy worker
        # finishes thousands a second, and metrics count them.
        log.log(logging.DEBUG if outcome == Outcome.DONE else logging.INFO,
                "run_finished run_id=%s tenant=%s attempt=%s outcome=%s", run.id,
                run.tenant_id, run.attempts, outcome)
        handle.outcome = outcome
        if handle.trace is not None:
            attempt_trace.end(handle.trace, outcome)
            handle.trace = None
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
        ctx, task, deadline = self._start_agent(handle)
        return await self._after_agent(handle, ctx, task, deadline)

    def _start_agent(self, handle: RunHandle) -> tuple[
            RunContext, asyncio.Task[Any], asyncio.TimerHandle | None]:
        handle.previous = None  # nothing more to wait for; let it be collected
        ctx = RunContext(handle.lease, self.store, cancel=handle.cancel, tools=handle.tools,
                         started=handle.claimed_at, fence=handle, clock=handle.terms.clock,
                         inbox_wake=handle.inbox_wake)
        deadline = None
        if (left := ctx.deadline_left_s) is not None:
            deadline = asyncio.get_running_loop().call_later(
                max(0.0, left), handle.stop, StopReason.DEADLINE)
        task = asyncio.create_task(
            self._agent(ctx) if not tracing.ENABLED else self._traced_agent(ctx, handle),
            name="run-" + handle.rid)
        handle.task = task
        if handle.cancel.is_set():
            task.cancel()
        return ctx, task, deadline

    async def _after_agent(self, handle: RunHandle, ctx: RunContext, task: asyncio.Task[Any],
                           deadline: asyncio.TimerHandle | None) -> Outcome:
        result: Any = None
        error: BaseException | None = None
        try:
            result = await self._until_lost(handle, task, grace_s=1.0)
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

    async def _traced_agent(self, ctx: RunContext, handle: RunHandle) -> Any:
        """_agent inside the attempt's span (tracing on only): the agent's
        model turns and tools are its children."""
        handle.trace = attempt_trace.begin(handle.lease)
        return await self._agent(ctx)

    async def _agent(self, ctx: RunContext) -> Any:
        await ctx.start()  # a budget spent by earlier attempts ends the run here
        try:
            result = await self.agent(ctx)
        except Exception as exc:
            if ctx.waiting_for is not None and exc is not ctx.waiting_for:
                # Agent code caught the wait and failed on: the wait stands.
                raise ctx.waiting_for from exc
            raise
        if ctx.waiting_for is not None:  # caught and swallowed: the wait stands
            raise ctx.waiting_for
        await ctx.flush()
        return result

    async def _stopped(self, handle: RunHandle, reason: StopReason | None,
                       error: BaseException | None) -> Outcome | None:
        """The endings that are not the agent's result or failure: a drain,
        a cancel, a wait for children, the budget."""
        lease = handle.lease
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
        if isinstance(error, WaitForInput):
            # Parked until a person answers: no lease, no slot, no attempt charged.
            wait = error
            status = await self._retry(handle, lambda: self.store.wait_input(
                lease, wait.name, prompt=wait.prompt, schema=wait.schema,
                timeout_s=wait.timeout_s))
            return Outcome.WAITING if status == RunStatus.WAITING else Outcome(status.value)
        if isinstance(error, WaitForChildren):
            # Parked until its children finish: no slot held, no attempt charged.
            status = await self._retry(handle, lambda: self.store.wait_children(lease))
            return Outcome.WAITING if status == RunStatus.PENDING else Outcome(status.value)
        if reason == StopReason.DEADLINE or isinstance(error, BudgetExceeded):
            message = str(error) if error else "deadline exceeded"
            await self._retry(handle, lambda: self.store.fail(
                lease, ErrorCode.BUDGET_EXCEEDED.value, message))
            return Outcome.DEAD
        return None

    async def _finish(self, handle: RunHandle, result: Any,
                      error: BaseException | None) -> Outcome:
        lease = handle.lease
        reason = handle.reason
        handle.closing = True
        if isinstance(error, LeaseLost) or not handle.writes_allowed:
            return self._lost(handle)
        stopped = await self._stopped(handle, reason, error)
        if stopped is not None:
            return stopped
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
            # The tenant reads this: frames by file name, no server path (issue 32).
            tb = traceback.extract_tb(error.__traceback__)[-3:]
            message += "".join(f"\n  {os.path.basename(f.filename)}:{f.lineno} in {f.name}"
                               for f in tb)
            log.warning("run_raised run_id=%s error=%s", lease.run_id, message.splitlines()[0],
                        exc_info=error)
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
                left_s = handle.fence_at - handle.terms.clock.monotonic()
                await asyncio.sleep(min(delay, max(0.0, left_s)))
                delay = min(2.0, delay * 2)
