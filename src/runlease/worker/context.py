"""RunContext: what agent code gets, and the only door it has to the queue.

    async def agent(ctx: RunContext) -> dict | None:
        await ctx.begin_turn()                      # counts against max_turns
        answer = await ctx.step("plan", call_model) # durable: not run again on retry
        result = await ctx.run_tool(["pytest", "-q"], timeout_s=300)
        await ctx.emit("message", {"text": answer})
        return {"answer": answer}

Every write goes through the run's lease (fenced); a write that finds the
lease gone raises LeaseLost and the worker stops the run. Transient database
trouble is retried here until the worker's own fencing gives up, so agents
do not see it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from runlease.clock import Clock, SystemClock
from runlease.core.bounds import Budget, ResultRefused
from runlease.core.redact_stream import StreamHoldback
from runlease.db.models import Lease, Step
from runlease.db.store import RunStore
from runlease.errors import DatabaseUnavailable, LeaseLost
from runlease.services.loop import sleep
from runlease.worker.cancellable_http import CancellableHttp
from runlease.worker.errors import BudgetExceeded, FatalError, RunCancelled, ToolTimeout
from runlease.worker.tool_output import OutputEvents
from runlease.worker.tools import ToolResult, ToolRunner

log = logging.getLogger(__name__)

T = TypeVar("T")
DELTA_FLUSH_S = 0.05
DELTA_FLUSH_CHARS = 2048
DELTA_EVENT_CHARS = 16 * 1024


class Fence(Protocol):
    """The attempt's lease as the worker sees it (a RunHandle)."""

    @property
    def lease_lost(self) -> bool: ...

    def may_write(self) -> bool: ...


class RunContext:
    def __init__(
        self,
        lease: Lease,
        store: RunStore,
        *,
        cancel: asyncio.Event,
        tools: ToolRunner,
        started: float | None = None,
        fence: Fence | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.lease = lease
        self._clock: Clock = clock or SystemClock()
        self._fence = fence
        self.store = store
        # Loaded on the first step(); a first lease (epoch 1) has none to load:
        # nothing ran before it. (A release or redrive keeps the epoch growing.)
        self._steps: dict[str, Step] | None = {} if lease.epoch == 1 else None
        self._cancel = cancel
        self._tools = tools
        self._started = self._clock.monotonic() if started is None else started
        self.budget = Budget.parse(lease.run.budget_json)
        self.turns = 0
        self.tool_calls = 0
        self.http = CancellableHttp(cancel)
        self._write_lock = asyncio.Lock()
        self._deltas: list[str] = []
        self._delta_chars = 0
        self._delta_kind = "message.delta"
        self._delta_flush: asyncio.Task[None] | None = None
        # The not-yet-safe tail of the current message (see delta).
        self._hold = StreamHoldback(store.redactor)
        self._flush_error: Exception | None = None

    # -- what the run is ------------------------------------------------------

    @property
    def run_id(self) -> Any:
        return self.lease.run.id

    @property
    def tenant_id(self) -> str:
        return self.lease.run.tenant_id

    @property
    def pool(self) -> str:
        return self.lease.run.pool

    @property
    def attempt(self) -> int:
        return self.lease.run.attempts

    @property
    def lease_epoch(self) -> int:
        return self.lease.epoch

    @property
    def input(self) -> dict[str, Any]:
        return self.lease.run.input_json

    # -- cancellation and budgets ------------------------------------------------

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def lease_lost(self) -> bool:
        """True once this attempt's lease is gone (another attempt may own the
        run now): the agent's task is being cancelled and nothing it writes
        will be stored. Agent code that catches the cancellation can read it
        to tell a lost lease from a Stop or a drain."""
        return self._fence is not None and self._fence.lease_lost

    @property
    def deadline_left_s(self) -> float | None:
        if self.budget.deadline_s is None:
            return None
        return self.budget.deadline_s - (self._clock.monotonic() - self._started)

    async def check(self) -> None:
        """Raise RunCancelled after a Stop, BudgetExceeded past the deadline."""
        if self._cancel.is_set():
            raise RunCancelled("the run was cancelled")
        left = self.deadline_left_s
        if left is not None and left <= 0:
            raise BudgetExceeded(f"deadline of {self.budget.deadline_s} s exceeded")

    async def begin_turn(self) -> int:
        """Count one model turn against max_turns; returns the turn number."""
        await self.check()
        self.turns += 1
        if self.budget.max_turns is not None and self.turns > self.budget.max_turns:
            raise BudgetExceeded(f"max_turns of {self.budget.max_turns} exceeded")
        return self.turns

    def count_tool_call(self) -> int:
        self.tool_calls += 1
        if self.budget.max_tool_calls is not None and self.tool_calls > self.budget.max_tool_calls:
            raise BudgetExceeded(f"max_tool_calls of {self.budget.max_tool_calls} exceeded")
        return self.tool_calls

    async def sleep(self, seconds: float) -> None:
        """Sleep, but wake with RunCancelled as soon as the run is cancelled."""
        if await sleep(seconds, self._cancel):
            raise RunCancelled("the run was cancelled")

    # -- writes, fenced by the lease ---------------------------------------------

    async def _write(self, op: Callable[[], Awaitable[T]]) -> T:
        """A fenced write that rides out database trouble, but never past the
        fence: each try first checks the attempt may still write, so a write
        retried through an outage is dropped, not sent, once the lease could
        have expired."""
        delay = 0.1
        while True:
            if self._fence is not None and not self._fence.may_write():
                raise LeaseLost(self.run_id, self.lease_epoch)
            try:
                return await op()
            except DatabaseUnavailable as exc:
                log.warning("run_write_retry run_id=%s error=%s", self.run_id, exc)
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

    async def emit(self, kind: str, data: Mapping[str, Any] | None = None) -> int:
        """Store an event (redacted, fenced) and notify followers; returns its seq."""
        await self.flush()
        async with self._write_lock:
            return await self._write(lambda: self.store.record_event(self.lease, kind,
                                                                     data or {}))

    async def delta(self, text: str, kind: str = "message.delta") -> None:
        """A token delta; deltas are coalesced into one event per ~50 ms.

        A message is redacted as a whole, not per event: each event ends
        only where no secret can straddle it (after whitespace, outside a
        `Bearer `/`Cookie:`/key block/`password = "..."` region, see
        StreamHoldback), and the rest waits for the next deltas or for the
        end of the message (a delta of another kind, any other write, the
        end of the run)."""
        self._raise_flush_error()
        if kind != self._delta_kind and (self._deltas or self._hold.holding):
            await self.flush()
        self._delta_kind = kind
        self._deltas.append(text)
        self._delta_chars += len(text)
        if self._delta_chars >= DELTA_FLUSH_CHARS:
            await self._flush_deltas(final=False)
        elif self._delta_flush is None:
            self._delta_flush = asyncio.create_task(self._flush_later(), name="delta-flush")

    async def _flush_later(self) -> None:
        await asyncio.sleep(DELTA_FLUSH_S)
        self._delta_flush = None
        try:
            await self._flush_deltas(final=False)
        except Exception as exc:  # kept, and raised by the agent's next write
            self._flush_error = exc

    def _raise_flush_error(self) -> None:
        if self._flush_error is not None:
            error, self._flush_error = self._flush_error, None
            raise error

    async def flush(self) -> None:
        """Write out coalesced deltas now, held text included: the message
        ends here (before any other write, and at the end of the run)."""
        if self._delta_flush is not None and asyncio.current_task() is not self._delta_flush:
            self._delta_flush.cancel()
            self._delta_flush = None
        self._raise_flush_error()
        await self._flush_deltas(final=True)

    async def _flush_deltas(self, *, final: bool) -> None:
        # Counted from here: a held tail does not make the next delta flush
        # at once (that would rescan the tail for every delta).
        text, self._deltas, self._delta_chars = "".join(self._deltas), [], 0
        text = self._hold.feed(text) if text else ""
        if final:
            text += self._hold.end()
        if not text:
            return
        kind = self._delta_kind
        if len(text) > DELTA_EVENT_CHARS:
            # One event holds at most DELTA_EVENT_CHARS, well under the event
            # bound. The store redacts each event alone, so redact the whole
            # first: a secret cut in two here is already masked.
            text = self.store.redactor.text(text)
        events = [(kind, {"text": piece}) for piece in _pieces(text, DELTA_EVENT_CHARS)]
        async with self._write_lock:
            await self._write(lambda: self.store.record_events(self.lease, events))

    async def step(self, key: str, fn: Callable[[], Awaitable[T]]) -> T:
        """A durable step: if any attempt committed a result for `key`, return
        it without calling fn; else await fn() and commit its result.

        The result must be JSON. What is returned is what was stored (redacted,
        as JSON gives it back), on the first run as on a replay, so an agent
        cannot behave differently the second time."""
        steps = await self._load_steps()
        if key in steps:
            cached: T = steps[key].result
            return cached
        await self.check()
        result = await fn()
        await self.flush()
        try:
            stored = await self._write(lambda: self.store.record_step(self.lease, key, result))
        except ResultRefused as exc:
            raise FatalError(f"step {key[:80]!r}: {exc.message}", code=exc.code) from None
        steps[key] = Step(self.run_id, key, stored, self.lease.epoch, self.attempt, _now())
        return stored  # type: ignore[no-any-return]

    async def has_step(self, key: str) -> bool:
        return key in await self._load_steps()

    async def _load_steps(self) -> dict[str, Step]:
        if self._steps is None:
            self._steps = await self._write(lambda: self.store.get_steps(self.run_id))
        return self._steps

    # -- tools ----------------------------------------------------------------------

    async def run_tool(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        output_event: str | None = None,
        output_data: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        """Run a subprocess in its own process group (counts against
        max_tool_calls); a Stop, the run's deadline or timeout_s ends the whole
        group: SIGTERM, then SIGKILL after the worker's grace.

        With output_event, the tool's output is also stored as events of that
        kind while it runs, `{**output_data, "stream", "text"}`, bounded and
        redacted, never cut inside a secret (worker/tool_output.py)."""
        await self.check()
        self.count_tool_call()
        left = self.deadline_left_s
        if left is not None:
            timeout_s = left if timeout_s is None else min(timeout_s, left)
        if output_event is None:
            try:
                return await self._tools.run(argv, timeout_s=timeout_s, cwd=cwd, env=env)
            except ToolTimeout:
                await self.check()  # the run's deadline, not the tool's own timeout
                raise
        await self.flush()
        output = OutputEvents(output_event, output_data, redactor=self.store.redactor)
        wake, done = asyncio.Event(), asyncio.Event()

        def seen(stream: str, chunk: bytes) -> None:
            output.feed(stream, chunk)
            if output.pending:
                wake.set()

        pump = asyncio.create_task(self._pump_output(output, wake, done), name="tool-output")
        try:
            result = await self._tools.run(argv, timeout_s=timeout_s, cwd=cwd, env=env,
                                           on_output=seen)
        except ToolTimeout:
            await self._end_pump(pump, output, wake, done)
            await self.check()
            raise
        except BaseException:
            pump.cancel()
            await asyncio.wait({pump})
            if not pump.cancelled():
                pump.exception()  # retrieved: the tool's own error is the one to raise
            raise
        await self._end_pump(pump, output, wake, done)
        return result

    async def _pump_output(self, output: OutputEvents, wake: asyncio.Event,
                           done: asyncio.Event) -> None:
        """Store the tool's lines as they come, coalesced like deltas."""
        while not done.is_set():
            await wake.wait()
            await sleep(DELTA_FLUSH_S, done)
            wake.clear()
            if events := output.take():
                await self._write_events(events)

    async def _end_pump(self, pump: asyncio.Task[None], output: OutputEvents,
                        wake: asyncio.Event, done: asyncio.Event) -> None:
        """Let the pump finish its write, then store what is left."""
        done.set()
        wake.set()
        await pump
        if events := output.finish():
            await self._write_events(events)

    async def _write_events(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        async with self._write_lock:
            await self._write(lambda: self.store.record_events(self.lease, events))

    async def close(self) -> None:
        if self._delta_flush is not None:
            self._delta_flush.cancel()
            await asyncio.wait({self._delta_flush})
        await self.http.aclose()


def _pieces(text: str, size: int) -> list[str]:
    """text in pieces of at most size characters, each ending after the last
    whitespace in it when there is one."""
    pieces = []
    while len(text) > size:
        cut = max(text.rfind(" ", 0, size), text.rfind("\n", 0, size)) + 1 or size
        pieces.append(text[:cut])
        text = text[cut:]
    pieces.append(text)
    return pieces


def _now() -> datetime:
    return datetime.now(UTC)
