"""The shape of every background loop: start(), an idempotent stop(), run_once().

Tasks are named and owned by their service; stop() asks the loop to finish,
waits up to a timeout, then cancels. Tests call run_once() directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

log = logging.getLogger(__name__)


async def sleep(delay: float, wakeup: asyncio.Event | None = None) -> bool:
    """Sleep up to `delay` seconds; True if `wakeup` was set first."""
    if wakeup is None:
        await asyncio.sleep(delay)
        return False
    if wakeup.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wakeup.wait(), timeout=max(0.0, delay))
        return True
    return False


def jittered(interval: float, spread: float = 0.25) -> float:
    """interval +- spread, so a fleet of pollers does not poll in step."""
    return interval * random.uniform(1 - spread, 1 + spread)


class Service:
    """A named loop owned by whoever starts it."""

    name = "service"
    # A loop with nothing to finish (a listener, a queue consumer) is cancelled
    # at stop() rather than asked.
    cancel_on_stop = False

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self.stopping = asyncio.Event()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._main(), name=self.name)

    async def _main(self) -> None:
        raise NotImplementedError

    async def stop(self, timeout_s: float = 5.0) -> None:
        self.stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        if self.cancel_on_stop:
            task.cancel()
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            log.warning("%s_stop_timeout timeout_s=%s", self.name, timeout_s)
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            log.error("%s_failed_at_stop", self.name, exc_info=task.exception())


class PeriodicService(Service):
    """run_once() every interval_s until stopped; an error is logged, not fatal."""

    def __init__(self, interval_s: float) -> None:
        super().__init__()
        self.interval_s = interval_s

    async def run_once(self) -> None:
        raise NotImplementedError

    async def _main(self) -> None:
        while not self.stopping.is_set():
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s_failed", self.name)
            await sleep(jittered(self.interval_s, 0.1), self.stopping)
        await self.on_stop()

    async def on_stop(self) -> None:
        """Runs once in the loop's own task after the last run_once()."""
