"""One pass over a pool, every --interval-s, in four steps:

    observe  the worker Deployment and the queue's demand (one connection)
    decide   the replicas (autoscale.decide: up at once, down after a delay)
    act      deletion costs before a scale-in; the manifests applied again,
             which repairs drift; an Event for a scale change
    report   the status to write, and the gauges

Each step is a function of what the one before returned, so a test can
call it alone; run() chains them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from runlease import metrics
from runlease.db.store import QueueStats
from runlease.operator import build, gauges, ownership
from runlease.operator import status as st
from runlease.operator.autoscale import Decision, decide, wanted
from runlease.operator.databases import Database
from runlease.operator.k8s import Kubernetes
from runlease.operator.spec import PoolSpec

log = logging.getLogger(__name__)


def now() -> datetime:
    return datetime.now(UTC)


def replicas_of(deployment: dict[str, Any]) -> int:
    """The replicas a Deployment asks for (its spec, not its status)."""
    return int((deployment.get("spec") or {}).get("replicas") or 0)


@dataclass(frozen=True)
class Observation:
    deployment: dict[str, Any] | None
    current: int  # replicas the Deployment asks for now (replicas.min if none)
    stats: QueueStats
    startable: int  # pending runs a claim could take now (store.startable_runs)
    lease_expiries: int

    @property
    def demand(self) -> int:
        """The runs that want a worker now: those a claim could start (due,
        within their tenant's cap, none in a paused pool) and those leased."""
        return self.startable + self.stats.leased


async def observe(spec: PoolSpec, k8s: Kubernetes, db: Database,
                  lease_window_s: float) -> Observation:
    deployment = await k8s.deployment(spec.namespace, build.names(spec)["deployment"])
    async with db.store.connection() as conn:  # one pooled connection for the queries
        stats = await db.store.queue_stats(spec.pool, conn=conn)
        startable = await db.store.startable_runs(spec.pool, conn=conn)
        expiries = await db.store.lease_expiries(spec.pool, lease_window_s, conn=conn)
    current = replicas_of(deployment) if deployment else spec.replicas_min
    return Observation(deployment, current, stats, startable, expiries)


async def first_replicas(spec: PoolSpec, k8s: Kubernetes, db: Database) -> int:
    """The replicas to apply on create or update: the Deployment's own if it
    exists (the pass owns scaling), else what the demand asks for now."""
    existing = await k8s.deployment(spec.namespace, build.names(spec)["deployment"])
    if existing is not None:
        return replicas_of(existing)
    async with db.store.connection() as conn:
        stats = await db.store.queue_stats(spec.pool, conn=conn)
        startable = await db.store.startable_runs(spec.pool, conn=conn)
    return wanted(spec, startable + stats.leased)


def plan(spec: PoolSpec, seen: Observation, low_since: datetime | None,
         when: datetime) -> Decision:
    return decide(spec, seen.current, seen.demand, low_since, when)


async def act(spec: PoolSpec, body: dict[str, Any], seen: Observation, decision: Decision,
              k8s: Kubernetes, db: Database) -> None:
    if decision.replicas < seen.current:
        await set_deletion_costs(spec, await db.store.leases_by_holder(spec.pool), k8s)
    # Applying every pass repairs drift: a hand-edited or deleted object is put back.
    for obj in build.objects(spec, body, decision.replicas):
        await k8s.apply(obj)
    if decision.replicas != seen.current and seen.deployment is not None:
        direction = "up" if decision.replicas > seen.current else "down"
        metrics.SCALE_CHANGES.labels(direction).inc()
        kopf.info(cast(kopf.Body, body), reason=f"Scaled{direction.capitalize()}",
                  message=f"workers {seen.current} -> {decision.replicas} for "
                          f"{seen.demand} runs (startable {seen.startable}, "
                          f"leased {seen.stats.leased})")


async def set_deletion_costs(spec: PoolSpec, leases: dict[str, int], k8s: Kubernetes) -> None:
    """Before scaling in, tell the ReplicaSet which workers are cheapest to
    remove: their number of leased runs (`leases`, by locked_by's pod UID,
    from store.leases_by_holder). Idle workers go first; a busy one drains
    and releases its runs."""
    for pod in await k8s.pods(spec.namespace, build.selector(spec)):
        meta = pod.get("metadata") or {}
        cost = str(leases.get(meta.get("uid", ""), 0))
        if (meta.get("annotations") or {}).get(build.DELETION_COST) != cost:
            await k8s.annotate_pod(spec.namespace, meta["name"], {build.DELETION_COST: cost})


def report(spec: PoolSpec, seen: Observation, decision: Decision, previous: dict[str, Any],
           when: datetime, generation: int | None = None) -> dict[str, Any]:
    """The status to write; exports the gauges as a side effect."""
    dep_status = (seen.deployment or {}).get("status") or {}
    observed = st.Observed(
        replicas=int(dep_status.get("replicas") or 0),
        ready=int(dep_status.get("readyReplicas") or 0),
        updated=int(dep_status.get("updatedReplicas") or 0), desired=decision.replicas,
        queue=seen.stats, lease_expiries=seen.lease_expiries, paused=spec.paused,
        generation=generation)
    gauges.export(spec, observed)
    out = st.status(observed, when, previous)
    out["scaleDownSince"] = st.format_time(decision.low_since) if decision.low_since else None
    out["selector"] = build.selector_string(spec)
    out["pool"] = spec.pool
    return out


async def run(body: dict[str, Any], spec: PoolSpec, k8s: Kubernetes, db: Database, *,
              lease_window_s: float,
              low_since: dict[tuple[str, str], datetime | None]) -> dict[str, Any] | None:
    """One pass; the status to write, or None when the pool is not (yet) this
    AgentRunPool's (ownership.py; PoolTaken when another one's).
    `low_since` keeps each pool's scale-down start between passes."""
    if not await ownership.check(db.store, spec):
        return None
    previous = body.get("status") or {}
    key = (spec.namespace, spec.name)
    seen = await observe(spec, k8s, db, lease_window_s)
    when = now()
    decision = plan(spec, seen, low_since.get(key)
                    or st.parse_time(previous.get("scaleDownSince")), when)
    low_since[key] = decision.low_since
    await act(spec, body, seen, decision, k8s, db)
    return report(spec, seen, decision, previous, when,
                  (body.get("metadata") or {}).get("generation"))
