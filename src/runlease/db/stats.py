"""Queue statistics for the operator, metrics and the console (sql/stats.sql).

Pending, delayed and dead runs are counted as they change (triggers append
deltas; the reaper's leader folds them: fold_counts), so a read costs the
same with a million runs waiting as with none; leased runs are counted from
their partial index, bounded by what is in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runlease.db.executor import Conn, Executor


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One pool's queue: per tenant (pending, ready now, leased), dead by code;
    the keys with the most runs parked for a slot (tenant, key) -> waiting,
    top TOP_KEYS only (issue 27: a gauge of bounded cardinality)."""

    by_tenant: dict[str, tuple[int, int, int]]
    dead_by_code: dict[str | None, int]
    oldest_ready_s: float
    # Runs waiting for a person's input, per tenant (issue 28): no slot, not claimable.
    waiting_by_tenant: dict[str, int] = field(default_factory=dict)
    keys_waiting: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def waiting(self) -> int:
        return sum(self.waiting_by_tenant.values())

    @property
    def pending(self) -> int:
        return sum(p for p, _, _ in self.by_tenant.values())

    @property
    def ready(self) -> int:
        return sum(r for _, r, _ in self.by_tenant.values())

    @property
    def leased(self) -> int:
        return sum(n for _, _, n in self.by_tenant.values())

    @property
    def dead(self) -> int:
        return sum(self.dead_by_code.values())


# Keys the per-key waiting gauge shows per pool (its labels stay bounded).
TOP_KEYS = 10
# Folds that moved this many deltas vacuum the deltas table after.
VACUUM_AFTER = 5_000


class StatsStore(Executor):
    """Counts by pool for autoscaling and gauges."""

    async def queue_stats(self, pool: str, *, conn: Conn | None = None) -> QueueStats:
        tenants = await self._rows("pool_queue_stats", {"pool": pool}, conn)
        dead = await self._rows("pool_dead_stats", {"pool": pool}, conn)
        keys = await self._rows("keys_waiting_top", {"pool": pool, "limit": TOP_KEYS}, conn)
        return QueueStats(
            by_tenant={r["tenant_id"]: (int(r["pending"]), int(r["ready"]), int(r["leased"]))
                       for r in tenants},
            dead_by_code={r["error_code"]: int(r["n"]) for r in dead},
            oldest_ready_s=max((float(r["oldest_ready_s"]) for r in tenants
                                if r["oldest_ready_s"] is not None), default=0.0),
            waiting_by_tenant={r["tenant_id"]: int(r["waiting"]) for r in tenants
                               if r["waiting"]},
            keys_waiting={(r["tenant_id"], r["key"]): int(r["waiting"]) for r in keys},
        )

    async def startable_runs(self, pool: str, *, conn: Conn | None = None) -> int:
        """Pending runs a claim could take now: due, within their tenant's
        cap, none while the pool is paused (the autoscaler's demand)."""
        rows = await self._rows("pool_startable", {"pool": pool}, conn)
        return int(rows[0]["n"])

    async def leases_by_holder(self, pool: str, *, conn: Conn | None = None) -> dict[str, int]:
        """Leased runs per holder: the first part of locked_by (a pod's UID)."""
        rows = await self._rows("pool_leases_by_holder", {"pool": pool}, conn)
        return {r["holder"]: int(r["n"]) for r in rows}

    async def fold_counts(self, *, conn: Conn | None = None) -> int:
        """Fold the count deltas into the totals (the reaper's leader, every
        pass); returns the deltas folded."""
        rows = await self._rows("counts_fold", {}, conn)
        await self._rows("counts_prune", {}, conn)
        deltas = int(rows[0]["deltas"])
        # VACUUM cannot run in a transaction: only on a pooled (autocommit)
        # connection of our own.
        await self._rows("counts_vacuum" if deltas >= VACUUM_AFTER and conn is None
                         else "counts_touch", {}, conn)
        return deltas

    async def lease_expiries(self, pool: str, window_s: float, *,
                             conn: Conn | None = None) -> int:
        rows = await self._rows("pool_lease_expiries", {"pool": pool, "window_s": window_s},
                                conn)
        return int(rows[0]["n"])
