"""The errors an HTTP caller sees: one hierarchy for every API runlease calls.

`ApiError` is what the runlease client raises for an error answer, and what
the operator's Kubernetes layer (`runlease.operator.k8s`) raises for a failed
call: the same type, so a caller catches one class whichever API it spoke to.
"""

from __future__ import annotations


class ApiError(Exception):
    """An error answer, or no answer: `status` (0 when none came back), and the
    body's code, message and field (code "" when the API gives none)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" if code
                         else f"{status}: {message}" if status else message)
        self.status, self.code, self.message, self.field = status, code, message, field


# Answers after which a stream is reconnected, not given up: the API without
# its database (503, with Retry-After), or a gateway in front of an API that
# is restarting (502, 504).
RETRY_STATUSES = frozenset({502, 503, 504})


class NotFound(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Conflict(ApiError):
    """409: the run's state does not allow it (cancel or redrive of a finished
    run; the message names the status), or an Idempotency-Key reused with
    another input."""
