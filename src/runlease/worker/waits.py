"""Cheap waits for the worker's per-run path: a busy worker makes and awaits
these for every run, thousands a second (docs/benchmarks.md, the drain's
profile), so they allocate no more than they must."""

from __future__ import annotations

import asyncio
from typing import Any


class Flag:
    """An asyncio.Event made only once someone waits on it: a run's flags are
    set by every run and waited on by few (a drain, a reclaim), and a busy
    worker makes three per run."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: asyncio.Event | None = None

    def set(self) -> None:
        self._set = True
        if self._event is not None:
            self._event.set()

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> bool:
        if self._set:
            return True
        if self._event is None:
            self._event = asyncio.Event()
        return await self._event.wait()


async def first_of(a: asyncio.Future[Any], b: asyncio.Future[Any]) -> None:
    """Until a or b is done: asyncio.wait({a, b}, return_when=FIRST_COMPLETED)
    without its sets, per-future wrapping and result sets. Every run of a busy
    worker waits like this once or twice (py-spy: asyncio.wait was an eighth
    of a draining worker's time)."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    a.add_done_callback(wake)
    b.add_done_callback(wake)
    try:
        await waiter
    finally:
        a.remove_done_callback(wake)
        b.remove_done_callback(wake)
