"""Retry backoff, as the specification of what the database computes.

The `run_nack` statement computes the same formula in SQL so the delay is
judged by the database clock; `tests/integration/test_transitions.py` checks
that the two agree.
"""

from __future__ import annotations

BACKOFF_BASE_S = 5
BACKOFF_CAP_S = 300


def backoff_s(attempts: int) -> int:
    """Seconds to wait before the next attempt, after `attempts` attempts failed."""
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    # 2 ** 60 is far past the cap; clamping the exponent keeps the int small.
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * (1 << min(attempts - 1, 60)))
