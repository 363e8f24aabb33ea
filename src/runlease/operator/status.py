"""A pool's status: counts and conditions, computed from what was observed. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from runlease.db.store import QueueStats

# Kubernetes' timestamp format (UTC, seconds): conditions and scaleDownSince.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(when: datetime) -> str:
    return when.strftime(TIME_FORMAT)


def parse_time(value: Any) -> datetime | None:
    """A timestamp written by format_time; None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.strptime(value, TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


@dataclass(frozen=True)
class Observed:
    replicas: int
    ready: int
    updated: int
    desired: int
    queue: QueueStats
    lease_expiries: int
    paused: bool = False
    generation: int | None = None  # the metadata.generation this pass acted on


def condition(kind: str, ok: bool, reason: str, message: str, now: datetime,
              previous: list[dict[str, Any]], generation: int | None = None) -> dict[str, Any]:
    """A condition in the usual Kubernetes shape (metav1.Condition): its
    lastTransitionTime kept while the status stays, and the generation of the
    spec it was computed from."""
    status = "True" if ok else "False"
    before = next((c for c in previous if c.get("type") == kind), None)
    since = before.get("lastTransitionTime") if before and before.get("status") == status \
        else None
    out = {"type": kind, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": since or format_time(now)}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def conditions(o: Observed, now: datetime, previous: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ready = o.ready >= o.desired
    rolling = o.updated < o.replicas or o.replicas != o.desired
    healthy = o.lease_expiries == 0
    g = o.generation
    return [
        condition("Ready", ready, "WorkersReady" if ready else "WorkersNotReady",
                  f"{o.ready} of {o.desired} workers ready", now, previous, g),
        condition("Progressing", rolling, "RollingOut" if rolling else "Stable",
                  f"{o.updated} of {o.replicas} workers updated; {o.desired} wanted", now,
                  previous, g),
        # Reconcile errors are reported by invalid(); a pass that observed
        # the pool found none.
        condition("Degraded", False, "AsExpected", "", now, previous, g),
        condition("LeasesHealthy", healthy, "NoExpiries" if healthy else "LeasesExpired",
                  f"{o.lease_expiries} leases expired recently (their workers stopped "
                  "renewing: crashed, killed or cut off)" if not healthy else
                  "no lease expired recently", now, previous, g),
        condition("Paused", o.paused, "SpecPaused" if o.paused else "Claiming",
                  f"spec.paused: no run is claimed; {o.queue.leased} leased runs go on"
                  if o.paused else "workers claim runs", now, previous, g),
    ]


def status(o: Observed, now: datetime, previous: dict[str, Any]) -> dict[str, Any]:
    return {
        "replicas": o.replicas,
        "readyReplicas": o.ready,
        "desiredReplicas": o.desired,
        "leaseExpiries": o.lease_expiries,
        "conditions": conditions(o, now, previous.get("conditions") or []),
        "queue": {"pending": o.queue.pending, "leased": o.queue.leased, "dead": o.queue.dead,
                  "oldestPendingSeconds": round(o.queue.oldest_ready_s, 1)},
    }


def invalid(message: str, generation: int | None, now: datetime,
            previous: dict[str, Any], reason: str = "InvalidSpec", *,
            condition_generation: int | None = None) -> dict[str, Any]:
    """The status of a pool that could not be reconciled (a bad spec, a
    missing Secret, an unreachable database). `generation` also becomes
    status.observedGeneration; a pass that found the pool taken reports its
    conditions' generation only (`condition_generation`)."""
    before = previous.get("conditions") or []
    g = generation if generation is not None else condition_generation
    out: dict[str, Any] = {"conditions": [
        condition("Ready", False, reason, message, now, before, g),
        condition("Degraded", True, reason, message, now, before, g),
    ]}
    if generation is not None:
        out["observedGeneration"] = generation
    return out
