"""Waiting for a person and taking messages, from agent code (issue 28).

    answer = await ctx.wait_for_input("approve", prompt="Push to main?",
                                      schema={"type": "boolean"}, timeout_s=3600)
    message = await ctx.receive(timeout_s=60)     # the next message, or None
    for m in await ctx.take_messages(): ...       # those waiting now, at once

wait_for_input is a durable step, 'input:<name>'. Until it has an answer
it raises WaitForInput, and the worker parks the run (`wait`, db/humans.py):
status waiting, no lease, no slot, the attempt not charged. The answer (over
HTTP, a resume link, or a chat message) is committed as the step's result
when the run goes back to pending; the next attempt replays the agent's
committed steps and wait_for_input returns the answer. A request that times
out raises InputTimeout there instead.

Messages: the k-th take of a run's life is the step 'message:<k>', committed
with the inbox's cursor in one fenced statement, so each message reaches the
agent once per run, across attempts and workers. The holder is woken by
NOTIFY (worker.py); it polls as well, since NOTIFY is not durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from runlease import tracing
from runlease.db.models import Lease, Step
from runlease.db.store import RunStore
from runlease.errors import RunleaseError
from runlease.services.loop import sleep

T = TypeVar("T")
Write = Callable[[Callable[[], Awaitable[T]]], Awaitable[T]]

# How often a receive looks at the inbox when no NOTIFY came.
INBOX_POLL_S = 1.0


class WaitForInput(RunleaseError):
    """Raised by ctx.wait_for_input until the request has an answer: let it
    propagate (the worker parks the run). If agent code swallows it, the
    worker parks the run all the same when the agent ends."""

    def __init__(self, name: str, prompt: str | None, schema: Any,
                 timeout_s: float | None) -> None:
        super().__init__(f"waiting for input {name!r}")
        self.name, self.prompt, self.schema, self.timeout_s = name, prompt, schema, timeout_s


class Inbox:
    """A run's inbox as its agent sees it: messages in order, each once."""

    def __init__(self, lease: Lease, store: RunStore,
                 steps: Callable[[], Awaitable[dict[str, Step]]], write: Write[Any],
                 cancel: asyncio.Event, wake: asyncio.Event | None) -> None:
        self._lease = lease
        self._store = store
        self._steps = steps
        self._write = write
        self._cancel = cancel
        self._wake = wake
        self._taken = 0  # takes so far in this attempt, replayed ones included

    async def take(self) -> dict[str, Any] | None:
        """The next message if one is there now (taken, as a step), else None."""
        seq = self._taken + 1
        steps = await self._steps()
        key = f"message:{seq}"
        if key in steps:
            self._taken = seq
            replayed: dict[str, Any] | None = steps[key].result
            return replayed
        message: dict[str, Any] | None = await self._write(
            lambda: self._store.take_message(self._lease, seq))
        if message is None:
            return None
        now = datetime.now(UTC)
        steps[key] = Step(self._lease.run_id, key, message, self._lease.epoch,
                          self._lease.run.attempts, now)
        self._taken = seq
        if tracing.ENABLED:
            _trace_message(message)
        return message

    async def receive(self, timeout_s: float | None, check: Callable[[], Awaitable[None]],
                      monotonic: Callable[[], float]) -> dict[str, Any] | None:
        """The next message, waiting up to timeout_s (None: until one comes or
        the run is stopped); None when the time is up."""
        deadline = None if timeout_s is None else monotonic() + max(0.0, timeout_s)
        while True:
            await check()
            if self._wake is not None:
                self._wake.clear()  # before the read: a NOTIFY after it wakes us
            message = await self.take()
            if message is not None:
                return message
            left = INBOX_POLL_S if deadline is None else min(INBOX_POLL_S,
                                                             deadline - monotonic())
            if left <= 0:
                return None
            if self._wake is None:
                await sleep(left, self._cancel)
            else:
                await _first(self._wake, self._cancel, left)

    async def take_all(self, limit: int = 100) -> list[dict[str, Any]]:
        taken: list[dict[str, Any]] = []
        while len(taken) < limit and (message := await self.take()) is not None:
            taken.append(message)
        return taken


def _trace_message(message: dict[str, Any]) -> None:
    """A `message` span (tracing on): from the message's sending to its
    taking by this attempt, a child of the attempt's span; its place in the
    inbox, never its text."""
    try:
        sent = datetime.fromisoformat(str(message["sent_at"]))
    except (KeyError, ValueError):
        return
    tracing.record_run_span("message", tracing.current_traceparent(), sent,
                            datetime.now(UTC), {"runlease.message.seq": int(message["seq"])})


async def _first(a: asyncio.Event, b: asyncio.Event, timeout_s: float) -> None:
    """Until a or b is set, or timeout_s passed."""
    waits = {asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())}
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
