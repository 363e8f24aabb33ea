"""Retry backoff and a run's retry policy, as the specification of what the
database computes.

The `run_nack` statement computes the same formula in SQL so the delay is
judged by the database clock; `tests/integration/test_transitions.py` checks
that the two agree. A run may carry its own policy (submitted with it); the
fields it leaves out take the defaults below.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from runlease.errors import ValidationError

BACKOFF_BASE_S = 5
BACKOFF_CAP_S = 300
BACKOFF_BASE_S_MAX = 86_400
BACKOFF_CAP_S_MAX = 7 * 86_400
NON_RETRYABLE_MAX = 32
# An error code as agents raise them (core/bounds.py checks the same).
ERROR_CODE_PATTERN = r"^[a-z][a-z0-9_.-]{0,63}$"
_CODE_RE = re.compile(ERROR_CODE_PATTERN)


def backoff_s(attempts: int, base_s: int = BACKOFF_BASE_S, cap_s: int = BACKOFF_CAP_S) -> int:
    """Seconds to wait before the next attempt, after `attempts` attempts failed."""
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    # 2 ** 60 is far past any cap; clamping the exponent keeps the int small.
    return min(cap_s, base_s * (1 << min(attempts - 1, 60)))


def _seconds(field: str, value: object, hi: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, f"must be an integer, got {type(value).__name__}")
    if not 0 <= value <= hi:
        raise ValidationError(field, f"must be between 0 and {hi}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A run's own retry policy; None fields take the defaults. A failure
    whose error code is in `non_retryable_codes` is dead at once."""

    backoff_base_s: int | None = None
    backoff_cap_s: int | None = None
    non_retryable_codes: tuple[str, ...] | None = None

    @classmethod
    def checked(cls, backoff_base_s: object = None, backoff_cap_s: object = None,
                non_retryable_codes: Iterable[object] | None = None) -> RetryPolicy:
        """The policy, validated (raises ValidationError naming the field)."""
        base = _seconds("backoff_base_s", backoff_base_s, BACKOFF_BASE_S_MAX)
        cap = _seconds("backoff_cap_s", backoff_cap_s, BACKOFF_CAP_S_MAX)
        if cap is None and base is not None and base > BACKOFF_CAP_S:
            cap = base  # a long base alone is not cut to the default cap
        # A cap below the base is allowed: every wait is then the cap.
        codes: tuple[str, ...] | None = None
        if non_retryable_codes is not None:
            if isinstance(non_retryable_codes, str | bytes):
                raise ValidationError("non_retryable_codes", "must be a list of error codes")
            items = list(non_retryable_codes)
            if len(items) > NON_RETRYABLE_MAX:
                raise ValidationError("non_retryable_codes",
                                      f"at most {NON_RETRYABLE_MAX} codes, got {len(items)}")
            for i, code in enumerate(items):
                if not isinstance(code, str) or not _CODE_RE.match(code):
                    raise ValidationError(f"non_retryable_codes[{i}]",
                                          f"must match {ERROR_CODE_PATTERN}")
            codes = tuple(dict.fromkeys(items))  # type: ignore[arg-type]
        return cls(base, cap, codes)

    @property
    def base_s(self) -> int:
        return BACKOFF_BASE_S if self.backoff_base_s is None else self.backoff_base_s

    @property
    def cap_s(self) -> int:
        return BACKOFF_CAP_S if self.backoff_cap_s is None else self.backoff_cap_s
