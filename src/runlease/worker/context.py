"""RunContext: what agent code gets, and the only door it has to the queue.

    async def agent(ctx: RunContext) -> dict | None:
        await ctx.begin_turn()                      # counts against max_turns
        await ctx.record_usage(input_tokens=812, output_tokens=95, cost=0.0021)
        answer = await ctx.step("plan", call_model) # durable: not run again on retry
        result = await ctx.run_tool(["pytest", "-q"], timeout_s=300)
        await ctx.emit("message", {"text": answer})
        ok = await ctx.wait_for_input("approve", prompt="Ship it?",
                                      schema={"type": "boolean"})  # parks, holding nothing
        note = await ctx.receive(timeout_s=30)      # a message sent to the run, or None
        return {"answer": answer}

Every write goes through the run's lease (fenced); a write that finds the
lease gone raises LeaseLost and the worker stops the run. Transient database
trouble is retried here until the worker's own fencing gives up. Budgets:
worker/budget.py; child runs: worker/children.py; input and messages:
worker/humans.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final, Protocol, TypeVar

from runlease.clock import Clock, SystemClock
from runlease.core.bounds import Budget, ResultRefused
from runlease.db.humans import check_input_name, check_schema
from runlease.db.models import Lease, Step
from runlease.db.store import RunStore
from runlease.db.usage import Usage
from runlease.errors import DatabaseUnavailable, LeaseLost, RunleaseError
from runlease.services.loop import sleep
from runlease.worker import deltas
from runlease.worker.budget import BudgetKeeper
from runlease.worker.cancellable_http import CancellableHttp
from runlease.worker.children import Children
from runlease.worker.deltas import DeltaStream
from runlease.worker.errors import FatalError, InputTimeout, RunCancelled, ToolTimeout
from runlease.worker.humans import Inbox, WaitForInput
from runlease.worker.tool_output import STREAM_MAX_BYTES, OutputEvents
from runlease.worker.tools import ToolResult, ToolRunner

log = logging.getLogger(__name__)

T = TypeVar("T")


class Fence(Protocol):
    """The attempt's lease as the worker sees it (a RunHandle)."""

    @property
    def lease_lost(self) -> bool: ...

    def may_write(self) -> bool: ...


# A run's tool output stored as events, over all its tool calls and attempts
# (issue 32: each call was bounded, the run was not: 11.8 kB of input stored
# 14.4 MB). Past either bound the rest is not stored, and one note (stream
# "note", run_truncated) says so; the steps' own results are not affected.
RUN_TOOL_OUTPUT_MAX_BYTES = 1024 * 1024
RUN_TOOL_OUTPUT_MAX_EVENTS = 1000

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
        inbox_wake: Callable[[], asyncio.Event] | None = None,
    ) -> None:
        self.lease = lease
        # What the run is: what agents read, fixed for the context's life.
        run = lease.run
        self.run_id: Final[Any] = run.id
        self.tenant_id: Final[str] = run.tenant_id
        self.pool: Final[str] = run.pool
        self.attempt: Final[int] = run.attempts
        self.lease_epoch: Final[int] = lease.epoch
        self.input: Final[dict[str, Any]] = run.input_json
        # The run's thread (issue 27), or None: the thread's other runs wait
        # until this one ends, so a conversation's state is this run's alone.
        self.thread_id: Final[str | None] = run.thread_id
        self._clock: Clock = clock or SystemClock()
        self._fence = fence
        self.store = store
        # Loaded on the first step(); a first lease (epoch 1) has none to load:
        # nothing ran before it. (A release or redrive keeps the epoch growing.)
        self._steps: dict[str, Step] | None = {} if lease.epoch == 1 else None
        self._cancel = cancel
        self._tools = tools
        started = self._clock.monotonic() if started is None else started
        self._budget = BudgetKeeper(lease, store, write=partial(fenced_write, fence, lease),
                                    clock=self._clock, started=started)
        # Made on first use: most runs use few of them, and a draining worker
        # makes a context per run, thousands a second (docs/benchmarks.md).
        self._children_: Children | None = None
        self._http: CancellableHttp | None = None
        self._write_lock_: asyncio.Lock | None = None
        self._stream: DeltaStream | None = None
        # [events, bytes] of tool output the run has stored, loaded on the
        # first tool call that streams its output.
        self._output_used: list[int] | None = None
        self._output_cut = False
        self._inbox_wake = inbox_wake
        self._inbox: Inbox | None = None
        # The request this attempt parks on, kept in case agent code swallows
        # the WaitForInput it raised: the worker parks the run all the same.
        self.waiting_for: WaitForInput | None = None

    @property
    def http(self) -> CancellableHttp:
        """An HTTP client whose requests end when the run is cancelled."""
        if self._http is None:
            self._http = CancellableHttp(self._cancel)
        return self._http

    @property
    def _children(self) -> Children:
        if self._children_ is None:
            self._children_ = Children(self.lease, self.store, self.step, self._write)
        return self._children_

    @property
    def _write_lock(self) -> asyncio.Lock:
        if self._write_lock_ is None:
            self._write_lock_ = asyncio.Lock()
        return self._write_lock_

    @property
    def idle(self) -> bool:
        """flush() and close() would do nothing: no delta held or pending, no
        usage count unwritten, no HTTP client (the worker's quick ending)."""
        return ((self._stream is None or self._stream.idle) and self._http is None
                and self._budget.synced)

    # -- cancellation and budgets ------------------------------------------------

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def lease_lost(self) -> bool:
        """True once this attempt's lease is gone: its task is being cancelled
        and nothing it writes is stored (tells a lost lease from a Stop)."""
        return self._fence is not None and self._fence.lease_lost

    @property
    def budget(self) -> Budget:
        return self._budget.budget

    @property
    def turns(self) -> int:  # this attempt's, replayed ones included
        return self._budget.turns

    @property
    def tool_calls(self) -> int:
        return self._budget.tool_calls

    @property
    def deadline_left_s(self) -> float | None:
        """What is left of deadline_s (wall time since the run was submitted)."""
        return self._budget.deadline_left_s

    async def check(self) -> None:
        """Raise RunCancelled after a Stop, BudgetExceeded past the deadline."""
        if self._cancel.is_set():
            raise RunCancelled("the run was cancelled")
        self._budget.check_deadline()

    async def start(self) -> None:
        """Before the agent (the worker calls it): BudgetExceeded if earlier
        attempts spent the budget."""
        await self._budget.start()

    async def begin_turn(self) -> int:
        """Count one model turn against max_turns; returns the turn number."""
        await self.check()
        return self._budget.begin_turn()

    def count_tool_call(self) -> int:
        return self._budget.count_tool_call()

    async def record_usage(self, *, input_tokens: int = 0, output_tokens: int = 0,
                           cost: float = 0.0) -> Usage:
        """Report model usage (fenced, summed over every attempt); returns the
        run's totals. BudgetExceeded when a total passes max_tokens or
        max_cost: the run ends dead at once."""
        return await self._budget.record(input_tokens, output_tokens, cost)

    async def submit_child(self, input: Mapping[str, Any], **options: Any) -> str:  # noqa: A002
        """Submit a child run in this run's tenant (a durable step; options:
        key, pool, priority, max_attempts, budget); returns its id."""
        return await self._children.submit(input, **options)

    async def wait_children(self) -> list[dict[str, Any]]:
        """Every child's outcome once all have finished; until then the run is
        parked holding no worker slot, and run again when they are (see
        worker/children.py)."""
        await self.flush()
        return await self._children.wait()

    # -- people: input and messages (worker/humans.py) ----------------------------

    async def wait_for_input(self, name: str, *, prompt: str | None = None,
                             schema: Mapping[str, Any] | None = None,
                             timeout_s: float | None = None) -> Any:
        """Ask a person and wait, holding no slot: a durable step. Returns the
        answer (checked against `schema`, a JSON schema, if given); raises
        InputTimeout if none came within timeout_s. Until the answer comes
        the run is parked as `waiting` and this attempt ends here; the next
        attempt replays the agent's steps and this call returns the answer."""
        try:
            check_input_name(name)
            schema = check_schema(dict(schema) if schema is not None else None)
        except RunleaseError as exc:
            raise FatalError(f"wait_for_input: {exc}", code="invalid_input_request") from None
        steps = await self._load_steps()
        if (step := steps.get(f"input:{name}")) is not None:
            answer = step.result
            if isinstance(answer, dict) and answer.get("timed_out") is True:
                raise InputTimeout(name)
            return answer.get("value") if isinstance(answer, dict) else answer
        await self.check()
        await self.flush()
        self.waiting_for = WaitForInput(name, prompt, schema, timeout_s)
        raise self.waiting_for

    @property
    def _messages(self) -> Inbox:
        if self._inbox is None:
            self._inbox = Inbox(self.lease, self.store, self._load_steps, self._write,
                                self._cancel, self._inbox_wake() if self._inbox_wake else None)
        return self._inbox

    async def receive(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """The next message sent to the run ({"text", "data"?, "seq",
        "sent_at"}), each once per run across attempts; waits up to timeout_s
        (None: until one comes or the run is stopped) and returns None when
        the time is up. The run keeps its slot while it waits here: to wait
        long for a person, use wait_for_input.

        The k-th take of the run is the durable step 'message:<k>': a later
        attempt gets the same messages again in the same order. So take
        messages in the agent's own flow, not inside a ctx.step function (a
        replayed step does not run its function, and the takes after it
        would be out of step)."""
        return await self._messages.receive(timeout_s, self.check, self._clock.monotonic)

    async def take_messages(self, limit: int = 100) -> list[dict[str, Any]]:
        """The messages waiting now (at most `limit`), taken at once: what a
        model loop adds as user messages before its next turn."""
        await self.check()
        return await self._messages.take_all(limit)

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        """Every message sent to the run, in order, as it comes (until the run
        is stopped): `async for message in ctx.messages(): ...`."""
        while True:
            message = await self.receive()
            if message is not None:
                yield message

    async def sleep(self, seconds: float) -> None:
        """Sleep, but wake with RunCancelled as soon as the run is cancelled."""
        if await sleep(seconds, self._cancel):
            raise RunCancelled("the run was cancelled")

    # -- writes, fenced by the lease ---------------------------------------------

    async def _write(self, op: Callable[[], Awaitable[T]]) -> T:
        return await fenced_write(self._fence, self.lease, op)

    async def emit(self, kind: str, data: Mapping[str, Any] | None = None) -> int:
        """Store an event (redacted, fenced) and notify followers; returns its seq."""
        await self.flush()
        async with self._write_lock:
            return await self._write(lambda: self.store.record_event(self.lease, kind,
                                                                     data or {}))

    async def delta(self, text: str, kind: str = "message.delta") -> None:
        """A token delta; deltas are coalesced into one event per ~50 ms, and
        a message is redacted as a whole (worker/deltas.py)."""
        if self._stream is None:
            self._stream = DeltaStream(self.store, self.lease, write=self._write,
                                       lock=self._write_lock)
        self._stream.raise_error()
        if self._stream.ends_message(kind):
            await self.flush()
        await self._stream.add(text, kind)

    async def flush(self) -> None:
        """Write out coalesced deltas now, held text included: the message
        ends here (before any other write, and at the end of the run)."""
        if self._stream is not None:
            await self._stream.end()
        await self._budget.sync()

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
        if self._output_used is None:
            self._output_used = list(await self._write(
                lambda: self.store.tool_output_used(self.run_id)))
        left = max(0, RUN_TOOL_OUTPUT_MAX_BYTES - self._output_used[1])
        output = OutputEvents(output_event, output_data, redactor=self.store.redactor,
                              max_bytes=min(STREAM_MAX_BYTES, left))
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
            await sleep(deltas.DELTA_FLUSH_S, done)
            wake.clear()
            if events := output.take():
                await self._write_events(events)

    async def _end_pump(self, pump: asyncio.Task[None], output: OutputEvents,
                        wake: asyncio.Event, done: asyncio.Event) -> None:
        """Let the pump finish its write, then store what is left."""
        done.set()
        wake.set()
        await pump
        events = output.finish()
        if output.dropped and output.max_bytes < STREAM_MAX_BYTES:
            # The run's bound cut it, not the call's: one note for the run.
            events = [e for e in events if e[1].get("stream") != "note"]
            events += self._run_cut_note(output.kind, output.data)
        if events:
            await self._write_events(events)

    def _run_cut_note(self, kind: str, data: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        if self._output_cut:
            return []
        self._output_cut = True
        return [(kind, {**data, "stream": "note", "truncated": True, "run_truncated": True,
                        "text": f"[the run's tool output is over its bound of "
                                f"{RUN_TOOL_OUTPUT_MAX_BYTES} bytes or "
                                f"{RUN_TOOL_OUTPUT_MAX_EVENTS} events: the rest is not "
                                "stored]\n"})]

    async def _write_events(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        used = self._output_used
        if used is not None:  # tool output: within the run's bounds
            room = max(0, RUN_TOOL_OUTPUT_MAX_EVENTS - 1 - used[0])  # 1 kept for the note
            notes = [e for e in events if e[1].get("run_truncated")]
            if len(events) - len(notes) > room:
                kind, data = events[0][0], {k: v for k, v in events[0][1].items()
                                            if k not in ("stream", "text", "truncated")}
                events = [e for e in events if not e[1].get("run_truncated")][:room]
                events += self._run_cut_note(kind, data)
            else:
                events = [e for e in events if not e[1].get("run_truncated")] + notes
            if not events:
                return
            used[0] += len(events)
            used[1] += sum(len(str(e[1].get("text", "")).encode()) for e in events)
        async with self._write_lock:
            await self._write(lambda: self.store.record_events(self.lease, events))

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.close()
        if self._http is not None:
            await self._http.aclose()


async def fenced_write(fence: Fence | None, lease: Lease, op: Callable[[], Awaitable[T]]) -> T:
    """A fenced write that rides out database trouble, never past the fence:
    a try after the lease could have expired is dropped, not sent. A function
    of the fence and the lease, not of the context: what the context hands it
    to (its budget) must not point back at it, or every run's context would
    be a cycle only the collector frees."""
    delay = 0.1
    while True:
        if fence is not None and not fence.may_write():
            raise LeaseLost(lease.run_id, lease.epoch)
        try:
            return await op()
        except DatabaseUnavailable as exc:
            log.warning("run_write_retry run_id=%s error=%s", lease.run_id, exc)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)


def _now() -> datetime:
    return datetime.now(UTC)
