"""A run's attempts history: who held each lease, when, and how it ended.

The claim appends each holder to the run's `holders` (worker, attempt,
when, and the run's event_seq then); the attempt ended with the first
attempt-ending lifecycle event after that seq (and before the next claim),
or, for the run's last attempt, with an ack (no event: the run is done) or
not yet (the run is leased).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runlease.core.states import RunStatus
from runlease.db.models import Event, Run

MAX_ATTEMPTS_SHOWN = 16
# The lifecycle events a lease ends with, and what the history calls them.
ENDINGS = {
    "run.retrying": "failed, retried",
    "run.dead": "failed, dead",
    "run.lease_expired": "lease expired",
    "run.released": "released (worker shut down)",
    "run.cancelled": "cancelled",
    "run.waiting": "waiting for its children",
}


@dataclass(frozen=True, slots=True)
class Attempt:
    attempt: int | None
    worker: str
    started: datetime | None
    ended: datetime | None
    outcome: str
    error_code: str | None = None


def _when(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def attempts(run: Run, holders: list[dict[str, Any]], lifecycle: list[Event]) -> list[Attempt]:
    """The run's attempts, oldest first (its last MAX_ATTEMPTS_SHOWN claims)."""
    endings = [e for e in lifecycle if e.kind in ENDINGS]
    out: list[Attempt] = []
    held = holders[-MAX_ATTEMPTS_SHOWN:]
    for i, h in enumerate(held):
        seq = _int(h.get("seq")) or 0
        next_seq = _int(held[i + 1].get("seq")) if i + 1 < len(held) else None
        end = next((e for e in endings if e.seq > seq
                    and (next_seq is None or e.seq <= next_seq)), None)
        worker = str(h.get("worker") or "")
        started = _when(h.get("at"))
        if end is not None:
            code = end.data.get("error_code")
            if end.kind == "run.lease_expired" and end.data.get("status") != "cancelled":
                code = "lease_expired"  # the reap's error code, set on the run row only
            outcome = ENDINGS[end.kind]
            if end.kind == "run.waiting" and isinstance(end.data.get("input"), str):
                outcome = f"waiting for input {end.data['input']!r}"
            out.append(Attempt(_int(h.get("attempt")), worker, started, end.created_at,
                               outcome, str(code) if code else None))
        elif next_seq is not None:  # its ending event is older than the events read
            out.append(Attempt(_int(h.get("attempt")), worker, started, None, "ended"))
        elif run.status is RunStatus.LEASED:
            out.append(Attempt(_int(h.get("attempt")), worker, started, None, "running"))
        elif run.status is RunStatus.DONE:
            out.append(Attempt(_int(h.get("attempt")), worker, started, run.finished_at,
                               "done"))
        else:
            out.append(Attempt(_int(h.get("attempt")), worker, started, None, "ended",
                               run.error_code))
    return out
