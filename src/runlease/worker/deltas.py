"""A run's token deltas: coalesced into one event per ~50 ms, redacted whole.

A message is redacted as a whole, not per event: each event ends only where
no secret can straddle it (after whitespace, outside a `Bearer `/`Cookie:`/
key block/`password = "..."` region, see StreamHoldback), and the rest waits
for the next deltas or for the end of the message (a delta of another kind,
any other write, the end of the run). Made by the run's context on its first
delta: most runs stream none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from runlease.core.redact_stream import StreamHoldback
from runlease.db.models import Lease
from runlease.db.store import RunStore
from runlease.worker.tool_output import text_pieces

DELTA_FLUSH_S = 0.05
DELTA_FLUSH_CHARS = 2048
DELTA_EVENT_CHARS = 16 * 1024

Write = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]


class DeltaStream:
    def __init__(self, store: RunStore, lease: Lease, *, write: Write,
                 lock: asyncio.Lock) -> None:
        """`write` is the context's fenced write, `lock` its write lock (one
        writer of the run's events at a time)."""
        self.store = store
        self.lease = lease
        self._write = write
        self._lock = lock
        self.kind = "message.delta"
        self._deltas: list[str] = []
        self._chars = 0
        self._later: asyncio.Task[None] | None = None
        # The not-yet-safe tail of the current message.
        self._hold = StreamHoldback(store.redactor)
        self._error: Exception | None = None

    @property
    def idle(self) -> bool:
        """Nothing held, pending, being written or failed."""
        return (not self._deltas and self._later is None and self._error is None
                and not self._hold.holding)

    def ends_message(self, kind: str) -> bool:
        """A delta of `kind` ends the message under way (flush it first)."""
        return kind != self.kind and bool(self._deltas or self._hold.holding)

    def raise_error(self) -> None:
        """The error of a write made in the background, raised once."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    async def add(self, text: str, kind: str) -> None:
        self.kind = kind
        self._deltas.append(text)
        self._chars += len(text)
        if self._chars >= DELTA_FLUSH_CHARS:
            await self._flush(final=False)
        elif self._later is None:
            self._later = asyncio.create_task(self._flush_later(), name="delta-flush")

    async def end(self) -> None:
        """Write out everything now, held text included: the message ends."""
        if self._later is not None and asyncio.current_task() is not self._later:
            self._later.cancel()
            self._later = None
        self.raise_error()
        await self._flush(final=True)

    async def close(self) -> None:
        if self._later is not None:
            self._later.cancel()
            await asyncio.wait({self._later})

    async def _flush_later(self) -> None:
        await asyncio.sleep(DELTA_FLUSH_S)
        self._later = None
        try:
            await self._flush(final=False)
        except Exception as exc:  # kept, and raised by the agent's next write
            self._error = exc

    async def _flush(self, *, final: bool) -> None:
        # Counted from here: a held tail does not make the next delta flush
        # at once (that would rescan the tail for every delta).
        text, self._deltas, self._chars = "".join(self._deltas), [], 0
        text = self._hold.feed(text) if text else ""
        if final:
            text += self._hold.end()
        if not text:
            return
        kind = self.kind
        if len(text) > DELTA_EVENT_CHARS:
            # One event holds at most DELTA_EVENT_CHARS, well under the event
            # bound. The store redacts each event alone, so redact the whole
            # first: a secret cut in two here is already masked.
            text = self.store.redactor.text(text)
        events = [(kind, {"text": piece}) for piece in text_pieces(text, DELTA_EVENT_CHARS)]
        async with self._lock:
            await self._write(lambda: self.store.record_events(self.lease, events))
