"""Clocks, injected rather than global.

Lease decisions are the database's (`now()`); the store passes `None` as the
`now` parameter of every statement so the server's clock is used. Tests inject
a `ManualClock` so backoff, reaping and aging can be exercised without sleeping:
every statement then uses the injected instant instead. The worker's own
monotonic clock (`monotonic()`) is used for one thing only: fencing itself.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def db_now(self) -> datetime | None:
        """The instant statements should treat as now; None means the server's `now()`."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes backwards."""


class SystemClock:
    def db_now(self) -> datetime | None:
        return None

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock tests move by hand; both the database instant and the monotonic one."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime")
        self._now = start
        self._mono = 0.0

    def db_now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        self._mono += seconds
