"""One error hierarchy for the whole package.

Callers branch on the type, never on the message: retryable conditions
(`DatabaseUnavailable`) and permanent ones (`ValidationError`, `LeaseLost`)
are distinct classes that carry the data a caller needs.
"""

from __future__ import annotations

from uuid import UUID


class RunleaseError(Exception):
    """Base of every error runlease raises on purpose."""


class ValidationError(RunleaseError, ValueError):
    """Bad input; nothing was written. `field` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownPool(ValidationError):
    """Enqueue (or a pool operation) named a pool that does not exist."""

    def __init__(self, pool: str) -> None:
        super().__init__("pool", f"unknown pool {pool!r}; create it first (runlease pools upsert)")
        self.pool = pool


class NotAllowed(ValidationError):
    """Well formed, but not permitted by what the admin configured (a webhook
    host off the allowlist): a 403 naming the field, not a 422."""


class ItemError:
    """Why one item of a batch was refused: its index, a code, the field."""

    __slots__ = ("code", "field", "index", "message")

    def __init__(self, index: int, code: str, field: str | None, message: str) -> None:
        self.index, self.code, self.field, self.message = index, code, field, message

    def as_dict(self) -> dict[str, object]:
        return {"index": self.index, "code": self.code, "field": self.field,
                "message": self.message}


class BatchRefused(ValidationError):
    """A batch was refused as a whole (nothing written); `errors` says why,
    item by item. `field` and `message` are those of the first."""

    def __init__(self, errors: list[ItemError]) -> None:
        first = errors[0]
        super().__init__(f"runs[{first.index}]" + (f".{first.field}" if first.field else ""),
                         f"{first.message} ({len(errors)} item(s) refused; nothing was "
                         "submitted)")
        self.errors = errors


class IdempotencyConflict(RunleaseError):
    """An idempotency key was reused with a different input."""

    def __init__(self, run_id: UUID, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} already names run {run_id} with a different input"
        )
        self.run_id = run_id
        self.key = key


class BatchConflict(BatchRefused, IdempotencyConflict):
    """A batch refused only for keys that name runs with other inputs: an
    IdempotencyConflict (that of the first such item) for callers that catch
    one, a BatchRefused naming every item for those that want them all."""

    def __init__(self, errors: list[ItemError], first: IdempotencyConflict) -> None:
        probe = BatchRefused(errors)  # its field and message; the MRO would call
        RunleaseError.__init__(self, str(probe))  # IdempotencyConflict's own init
        self.field, self.message, self.errors = probe.field, probe.message, errors
        self.run_id = first.run_id
        self.key = first.key


class RunNotFound(RunleaseError, LookupError):
    def __init__(self, run_id: UUID) -> None:
        super().__init__(f"run {run_id} not found")
        self.run_id = run_id


class InvalidTransition(RunleaseError):
    """An operator-level transition does not apply to the run's current state
    (for example redrive of a run that is not dead)."""

    def __init__(self, run_id: UUID, action: str, status: str | None) -> None:
        super().__init__(f"cannot {action} run {run_id} in status {status}")
        self.run_id = run_id
        self.action = action
        self.status = status


class ThreadBusy(RunleaseError):
    """A `reject` submit to a thread with an unfinished run: a 409 naming it."""

    def __init__(self, thread_id: str, run_id: UUID, status: str) -> None:
        super().__init__(f"thread {thread_id!r} is busy with run {run_id} ({status})")
        self.thread_id, self.run_id, self.status = thread_id, run_id, status


class LeaseLost(RunleaseError):
    """A fenced write changed zero rows: this worker no longer holds the lease.

    The only correct reaction is to stop working on the run and write nothing more.
    """

    def __init__(self, run_id: UUID, lease_epoch: int) -> None:
        super().__init__(f"lease on run {run_id} (epoch {lease_epoch}) is lost")
        self.run_id = run_id
        self.lease_epoch = lease_epoch


class IncarnationEnded(RunleaseError):
    """The worker incarnation that asked is not live (ended, expired, or
    never registered): it holds no lease any more and may claim nothing.
    Its worker stops every run it held and registers under a new id."""

    # The SQLSTATE runlease_claim raises it with (functions.sql).
    SQLSTATE = "RLW01"

    def __init__(self, worker: str, message: str | None = None) -> None:
        super().__init__(message or f"worker incarnation {worker!r} is not live")
        self.worker = worker


class DatabaseUnavailable(RunleaseError):
    """The database could not be reached or the connection broke; retryable."""


class MigrationError(RunleaseError):
    """The schema on the server does not match what this version expects."""


class SettingsError(RunleaseError, ValueError):
    """A setting is missing or out of range; raised at start with a clear message."""
