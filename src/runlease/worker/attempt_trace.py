"""The spans of an attempt (tracing.py): `queue.wait` and `attempt`.

Only called while tracing is on (claimer.py and runner.py test
tracing.ENABLED first): the runs' stored trace contexts are read apart from
the claim, once per claim batch, so the claim is as lean as ever when
tracing is off.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from runlease import tracing
from runlease.core.states import Outcome
from runlease.db.executor import Conn
from runlease.db.models import Lease
from runlease.db.store import RunStore
from runlease.errors import RunleaseError

log = logging.getLogger(__name__)

# Outcomes that are not a failure of the attempt.
_OK = frozenset({Outcome.DONE, Outcome.RELEASED, Outcome.CANCELLED, Outcome.WAITING})


# The stored trace context of runs claimed and not started yet, by run id
# (read_contexts fills it once per claim batch; begin takes each out).
_claimed: dict[Any, str] = {}


async def read_contexts(store: RunStore, leases: Sequence[Lease], conn: Conn) -> None:
    """Read the claimed runs' trace contexts, in one statement on the claim's
    connection (a statement per run on the shared pool cost the drain
    measurably: every run waited for a connection first)."""
    try:
        _claimed.update(await store.traceparents([lease.run_id for lease in leases],
                                                 conn=conn))
    except (RunleaseError, OSError) as exc:  # new traces, then: never a failed run
        log.warning("trace_context_unread runs=%d error=%s", len(leases), exc)


def begin(lease: Lease) -> Any:
    """Record the run's queue wait for this attempt and start the attempt's
    span, current in the calling task (the agent's) from now on."""
    run = lease.run
    traceparent = _claimed.pop(run.id, None)
    attributes = {"runlease.run_id": str(run.id), "runlease.attempt": run.attempts,
                  "runlease.pool": run.pool}
    tracing.record_run_span("queue.wait", traceparent, run.available_at, run.updated_at,
                            attributes)
    return tracing.start_span("attempt", traceparent, {
        **attributes, "runlease.tenant": run.tenant_id, "runlease.lease_epoch": run.lease_epoch,
        "runlease.max_attempts": run.max_attempts, "runlease.worker": lease.worker})


def end(span: Any, outcome: Outcome) -> None:
    tracing.end_span(span, {"runlease.outcome": outcome.value},
                     error=None if outcome in _OK else outcome.value)
