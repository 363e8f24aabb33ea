"""Wait on conditions, never on bare sleeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(
    probe: Callable[[], Awaitable[T | None]], *, timeout_s: float = 30, every_s: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll `probe` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(every_s)


def until_sync(
    probe: Callable[[], T | None], *, timeout_s: float = 30, every_s: float = 0.05,
    what: str = "condition",
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)
