"""Bounds of what a submit may add to a run: its labels and when it may start.

Checked before anything is written, like core/bounds.py (each check raises
`ValidationError` naming the field); the API's schemas use the same limits
and patterns so the OpenAPI document says exactly what is accepted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime, timedelta

from runlease.errors import ValidationError

LABELS_MAX = 16
LABEL_KEY_MAX_CHARS = 63
LABEL_VALUE_MAX_CHARS = 256
# Like a Kubernetes label name (letters, digits, - _ . and / inside), so a
# `label=key:value` filter splits at the first colon without ambiguity.
LABEL_KEY_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_./-]{0,61}[A-Za-z0-9])?$"
# Any text but control characters (PostgreSQL text cannot hold NUL at all).
LABEL_VALUE_PATTERN = r"^[^\x00-\x1f\x7f]*$"
_KEY_RE = re.compile(LABEL_KEY_PATTERN)
_VALUE_RE = re.compile(LABEL_VALUE_PATTERN)

# A run may be scheduled at most this far ahead: a year is the horizon of
# "run this later"; further out is a calendar, not a queue.
MAX_DELAY_S = 366 * 24 * 3600


def check_label_key(field: str, key: object) -> str:
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValidationError(
            field, f"label keys are 1-{LABEL_KEY_MAX_CHARS} characters: letters, digits and "
                   "- _ . / inside, a letter or digit at each end"
                   + (f", got {key[:70]!r}" if isinstance(key, str) else ""))
    return key


def check_label_value(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValidationError(field, f"label values are strings, got {type(value).__name__}")
    if len(value) > LABEL_VALUE_MAX_CHARS:
        raise ValidationError(field, f"label values are at most {LABEL_VALUE_MAX_CHARS} "
                                     f"characters, got {len(value)}")
    if not _VALUE_RE.match(value) or not _encodable(value):
        raise ValidationError(field, "label values must not hold control characters")
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def check_labels(value: object) -> str | None:
    """The labels as the JSON text to store; None for no labels."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValidationError("labels", f"must be an object of strings, got "
                                        f"{type(value).__name__}")
    if len(value) > LABELS_MAX:
        raise ValidationError("labels", f"at most {LABELS_MAX} labels, got {len(value)}")
    for key, item in value.items():
        check_label_key("labels", key)
        check_label_value(f"labels.{key}", item)
    return json.dumps(dict(value), separators=(",", ":"), ensure_ascii=False) if value else None


def check_start(run_at: object, delay_s: object, now: datetime) -> tuple[datetime | None,
                                                                         float | None]:
    """When the run may start: at `run_at` (timezone-aware) or `delay_s` from
    now, not both, at most MAX_DELAY_S ahead. A time in the past means now."""
    if run_at is not None and delay_s is not None:
        raise ValidationError("run_at", "give run_at or delay_s, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime) or run_at.tzinfo is None:
            raise ValidationError("run_at", "must be an RFC 3339 time with its offset "
                                            "(2026-12-01T09:00:00Z)")
        if run_at - now > timedelta(seconds=MAX_DELAY_S):
            raise ValidationError("run_at", f"at most {MAX_DELAY_S // 86400} days ahead")
        return run_at, None
    if delay_s is not None:
        if isinstance(delay_s, bool) or not isinstance(delay_s, int | float) \
                or not math.isfinite(delay_s):
            raise ValidationError("delay_s", "must be a number of seconds")
        if not 0 <= delay_s <= MAX_DELAY_S:
            raise ValidationError("delay_s", f"must be between 0 and {MAX_DELAY_S}, "
                                             f"got {delay_s}")
        return None, float(delay_s) if delay_s > 0 else None
    return None, None
