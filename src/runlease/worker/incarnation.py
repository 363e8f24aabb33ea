"""A worker incarnation: one registered life of this worker process.

Its id is the `locked_by` of every run it claims, and its row in the
workers registry is the lease of all of them: the lease keeper renews that
one row, whatever the runs held. An incarnation is over when the database
ended it (a renewal found no live row: the reaper has requeued, or will
requeue, everything it held) or when this worker's own monotonic clock
says its lease could have expired (self-fencing). Either way every run it
held stops, nothing more is written for them, the row is never renewed
again, and the worker registers a new incarnation for what it claims next.

Why the whole incarnation and never one run: the database knows one lease
per incarnation. A run stopped here while its incarnation went on being
renewed would stay leased, by a live holder, with nobody running it.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

log = logging.getLogger(__name__)

# ":" and 8 hex digits after the worker's identity.
INCARNATION_SUFFIX_CHARS = 9


def incarnation_id(identity: str) -> str:
    """A new incarnation id: the worker's identity (pod UID or host, boot id,
    pid) and a random part, so a restarted container that kept its identity
    (same pod, boot and pid 1) never meets an id used before."""
    return f"{identity}:{secrets.token_hex(4)}"


class Incarnation:
    """One incarnation, by this worker's clock: `fence_at` is when its leases
    could expire (the last renewal's send time plus the lease, less the
    margin); past it nothing may be written for its runs."""

    __slots__ = ("_on_over", "fence_at", "id", "over", "reason")

    def __init__(self, incarnation: str, fence_at: float,
                 on_over: Callable[[Incarnation], None] | None = None) -> None:
        self.id = incarnation
        self.fence_at = fence_at
        self.over = False
        self.reason = ""
        self._on_over = on_over

    def renewed(self, fence_at: float) -> None:
        """A renewal sent before `fence_at - fence_after_s` committed. An
        incarnation already over stays over: its runs have stopped."""
        if not self.over:
            self.fence_at = max(self.fence_at, fence_at)

    def end(self, reason: str) -> bool:
        """Over, for good (first caller wins; True if this call ended it):
        whoever noticed first (the keeper's fence, a run's own fence check,
        a renewal that found no row) ends it, and the keeper stops its runs."""
        if self.over:
            return False
        self.over = True
        self.reason = reason
        self.fence_at = float("-inf")
        log.error("incarnation_over worker=%s reason=%s", self.id, reason)
        if self._on_over is not None:
            self._on_over(self)
        return True

    def __repr__(self) -> str:
        return f"Incarnation({self.id!r}, over={self.over})"
