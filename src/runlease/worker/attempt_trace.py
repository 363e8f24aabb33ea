"""The spans of an attempt (tracing.py): `queue.wait` and `attempt`.

Only called while tracing is on (runner.py tests tracing.ENABLED first): the
run's stored trace context is read apart from the claim, so the claim is as
lean as ever when tracing is off.
"""

from __future__ import annotations

import logging
from typing import Any

from runlease import tracing
from runlease.core.states import Outcome
from runlease.db.store import RunStore
from runlease.errors import RunleaseError

log = logging.getLogger(__name__)

# Outcomes that are not a failure of the attempt.
_OK = frozenset({Outcome.DONE, Outcome.RELEASED, Outcome.CANCELLED, Outcome.WAITING})


async def begin(store: RunStore, lease: Any) -> Any:
    """Record the run's queue wait for this attempt and start the attempt's
    span, current in the calling task (the agent's) from now on."""
    run = lease.run
    traceparent = None
    try:
        traceparent = await store.traceparent(run.id)
    except (RunleaseError, OSError) as exc:  # a new trace, then: never a failed run
        log.warning("trace_context_unread run_id=%s error=%s", run.id, exc)
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
