"""The operator's per-pool gauges, set from what a pass observed.

The gauges themselves are declared with every other metric in
runlease/metrics.py; this keeps them true: a tenant whose queue emptied, or
an error code whose dead runs retention deleted, is removed, not left at its
last value.
"""

from __future__ import annotations

from runlease import metrics
from runlease.operator.spec import PoolSpec
from runlease.operator.status import Observed

STATES = ("pending", "ready", "leased")


class PoolGauges:
    def __init__(self) -> None:
        # Per pool: the (tenant, state) and error-code label sets last exported.
        self._exported: dict[str, tuple[set[tuple[str, str]], set[str]]] = {}
        # Per pool: the (tenant, key) of the per-key waiting gauge last exported.
        self._keys: dict[str, set[tuple[str, str]]] = {}

    def export(self, spec: PoolSpec, observed: Observed) -> None:
        stats = observed.queue
        queue_now = {(tenant, state) for tenant in stats.by_tenant for state in STATES}
        queue_now |= {(tenant, "waiting") for tenant in stats.waiting_by_tenant}
        dead_now = {code or "" for code in stats.dead_by_code}
        queue_before, dead_before = self._exported.get(spec.pool, (set(), set()))
        for tenant, state in queue_before - queue_now:
            metrics.QUEUE_RUNS.remove(spec.pool, tenant, state)
        for code in dead_before - dead_now:
            metrics.DEAD_RUNS.remove(spec.pool, code)
        self._exported[spec.pool] = (queue_now, dead_now)
        for tenant, counts in stats.by_tenant.items():
            for state, value in zip(STATES, counts, strict=True):
                metrics.QUEUE_RUNS.labels(spec.pool, tenant, state).set(value)
        for tenant, value in stats.waiting_by_tenant.items():
            # Waiting for a person: no slot, not demand for workers.
            metrics.QUEUE_RUNS.labels(spec.pool, tenant, "waiting").set(value)
        keys_before = self._keys.get(spec.pool, set())
        for tenant, key in keys_before - set(stats.keys_waiting):
            metrics.KEY_WAITING.remove(spec.pool, tenant, key)
        self._keys[spec.pool] = set(stats.keys_waiting)
        for (tenant, key), n in stats.keys_waiting.items():
            metrics.KEY_WAITING.labels(spec.pool, tenant, key).set(n)
        for error_code, n in stats.dead_by_code.items():
            metrics.DEAD_RUNS.labels(spec.pool, error_code or "").set(n)
        metrics.OLDEST_PENDING.labels(spec.pool).set(stats.oldest_ready_s)
        metrics.LEASE_EXPIRIES.labels(spec.pool).set(observed.lease_expiries)
        metrics.DESIRED_REPLICAS.labels(spec.namespace, spec.pool).set(observed.desired)
        metrics.POOL_REPLICAS.labels(spec.namespace, spec.pool, "total").set(observed.replicas)
        metrics.POOL_REPLICAS.labels(spec.namespace, spec.pool, "ready").set(observed.ready)


# One per process: the registry the gauges live in is process-wide too.
GAUGES = PoolGauges()


def export(spec: PoolSpec, observed: Observed) -> None:
    GAUGES.export(spec, observed)
