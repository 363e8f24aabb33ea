"""Wait on conditions, never on bare sleeps: the one waiting helper of the
tests (`until` for a coroutine, `until_sync` in a thread, `eventually` for a
plain check from a coroutine)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# What a check that looks into something not there yet raises (a `.get()` of
# a missing field, an empty list's first item): not yet true, not a failure.
NOT_YET: tuple[type[Exception], ...] = (AssertionError, KeyError, ValueError, IndexError,
                                        TypeError, StopIteration)


class _Deadline:
    """One wait's deadline, and why the probe was last not satisfied."""

    def __init__(self, timeout_s: float, what: str,
                 not_yet: tuple[type[Exception], ...] = ()) -> None:
        self.timeout_s, self.what, self.not_yet = timeout_s, what, not_yet
        self.at = time.monotonic() + timeout_s
        self.error: Exception | None = None

    def attempt(self, probe: Callable[[], T | None]) -> T | None:
        """What a plain probe returns; None when it raised "not yet"."""
        try:
            return probe()
        except self.not_yet as exc:
            self.error = exc
            return None

    def check(self) -> None:
        """Raise AssertionError once the deadline has passed."""
        if time.monotonic() > self.at:
            why = f": {self.error!r}" if self.error is not None else ""
            raise AssertionError(f"timed out after {self.timeout_s} s waiting for "
                                 f"{self.what}{why}") from self.error


async def until(
    probe: Callable[[], Awaitable[T | None]], *, timeout_s: float = 30, every_s: float = 0.05,
    what: str = "condition", not_yet: tuple[type[Exception], ...] = (),
) -> T:
    """Poll `probe` until it returns something truthy; return that. An
    exception of a `not_yet` type counts as not yet true."""
    deadline = _Deadline(timeout_s, what)
    while True:
        try:
            value = await probe()
        except not_yet as exc:
            value, deadline.error = None, exc
        if value:
            return value
        deadline.check()
        await asyncio.sleep(every_s)


def until_sync(
    probe: Callable[[], T | None], *, timeout_s: float = 30, every_s: float = 0.05,
    what: str = "condition", not_yet: tuple[type[Exception], ...] = (),
) -> T:
    """until() for a thread: `probe` is a plain function, the wait a sleep."""
    deadline = _Deadline(timeout_s, what, not_yet)
    while not (value := deadline.attempt(probe)):
        deadline.check()
        time.sleep(every_s)
    return value


async def eventually(check: Callable[[], Any], wait_s: float = 10.0,
                     interval: float = 0.05) -> Any:
    """until_sync() from a coroutine: a plain check that raises (NOT_YET) or
    returns something falsy (None too) keeps waiting."""
    deadline = _Deadline(wait_s, "check", NOT_YET)
    while not (value := deadline.attempt(check)):
        deadline.check()
        await asyncio.sleep(interval)
    return value
