r"""The run state machine, drawn once.

All times are the database's `now()`. `attempts` counts claims; `lease_epoch`
is the fencing token minted by every claim.

                         request_cancel
        +-----------------------------------------------------------+
        |                                                           v
    enqueue --> [pending] --claim--> [leased] --ack--------------> [done]
                 ^  ^  ^               | | | \
                 |  |  |   nack        | | |  \--fail / nack at max /
                 |  |  +---(backoff)---+ | |      reap at max ---> [dead] --redrive--+
                 |  +------reap----------+ |                                         |
                 |         release (drain, attempt not charged)                      |
                 +-------------------------------------------------------------------+
                                           |
                        request_cancel sets cancel_requested_at,
                        the worker finalizes ----------------------> [cancelled]

    claim      pending, available_at <= now, no cancel, tenant under its limit -> leased;
               attempts += 1, lease_epoch += 1, locked_by = worker incarnation
    heartbeat  one row per worker incarnation: live & me -> expires_at = now + lease
               (a run's lease is live while its holder's incarnation is live)
    ack        leased & mine -> done
    nack       leased & mine -> pending at now + max(min(300, 5 * 2^(attempts-1)) s,
               the failure's retry_after_s), or dead when attempts >= max_attempts,
               or cancelled when a cancel was requested
    fail       leased & mine -> dead
    release    leased & mine -> pending now, attempts -= 1
    cancel     pending -> cancelled at once; leased -> cancel_requested_at, NOTIFY
    finalize   leased & mine & cancel requested -> cancelled
    reap       incarnation expired -> ended (it never renews again); in the same
               transaction its leased runs -> pending, or dead ('lease_expired') at max
    redrive    dead -> pending, attempts reset
    wait       leased & mine -> waiting (ctx.wait_for_input): no lease, no slot, the
               attempt not charged; never claimed nor reaped
    answer     waiting & asked for <name> -> pending now, the answer committed as the
               step 'input:<name>' in the same statement, once
    timeout    waiting past the request's time -> pending, the step = {"timed_out": true}
    cancel     waiting -> cancelled at once (as pending)
    message    pending, leased or waiting -> appended to the inbox; the holder is woken

"mine" is the fencing triple (locked_by, lease_epoch, status = 'leased') with
the holder's incarnation live by the database clock; a write that matches zero
rows raises `LeaseLost`. A worker whose incarnation ended fences every run it
held and registers again under a new incarnation id.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    PENDING = "pending"
    LEASED = "leased"
    WAITING = "waiting"  # for a person's input (issue 28): no lease, no slot
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({RunStatus.DONE, RunStatus.DEAD, RunStatus.CANCELLED})


class Outcome(StrEnum):
    """How one attempt ended on a worker: the `outcome` label of the worker's
    metrics and of its run_finished log."""

    DONE = "done"
    RETRYING = "retrying"
    DEAD = "dead"
    CANCELLED = "cancelled"
    RELEASED = "released"  # drained: back to pending, the attempt not charged
    WAITING = "waiting"  # parked for its children or a person: the attempt not charged
    LEASE_LOST = "lease_lost"
    SELF_FENCED = "self_fenced"
    UNKNOWN = "unknown"  # the worker itself failed; logged with its traceback


class ErrorCode(StrEnum):
    """Error codes the queue itself writes; agents may write their own."""

    LEASE_EXPIRED = "lease_expired"
    # The worker could not write how an attempt ended (its own failure): its
    # lease keeper hands the run back as a retryable failure.
    WORKER_FAILED = "worker_failed"
    BUDGET_EXCEEDED = "budget_exceeded"
    RETRYABLE = "retryable"
    FATAL = "fatal"
    TOOL_TIMEOUT = "tool_timeout"
    # A request for a person's input timed out and the agent did not catch it.
    INPUT_TIMEOUT = "input_timeout"
    UNEXPECTED = "unexpected"
    # A result or step the store refused: each ends its own run, never a batch.
    RESULT_TOO_LARGE = "result_too_large"
    RESULT_NOT_JSON = "result_not_json"
    # An agent's own code that is not a code (see bounds.error_code).
    INVALID_ERROR_CODE = "invalid_error_code"
