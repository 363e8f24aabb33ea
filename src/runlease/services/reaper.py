"""The reaper: expired leases back to the queue, retention, the workers
registry's stale rows, folding the queue counts' deltas and the workers'
stale writes (the console's lease health per pool); and the leader's
economics passes: the usage rollup, parents whose children have finished
made due again. (Completion webhooks are not in the pass: a receiver must
not delay a reap. services/webhooks.py's dispatcher sends them, beside it.)

A lease belongs to a worker incarnation: reaping ends the incarnations
that stopped renewing and requeues the runs they held, in the same
statement. It reads one index descent per holder and the leases of holders
that cannot renew, never every lease: each pass is bounded whatever the
number of live leases.

Retention follows each pool's own retention_s (agent_run_pools), so whichever
process wins the election deletes by the same windows: the pool row is the
one source, set from the AgentRunPool, `runlease pools` or the API.

Only the elected leader runs it (so a fleet does not reap in step); the
reap statement itself is safe to run concurrently, so a brief overlap while
leadership changes hands costs nothing but work.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from runlease import metrics
from runlease.db.store import RunStore
from runlease.services.leader import LeaderElector
from runlease.services.loop import PeriodicService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReapBounds:
    """How much one pass may do, whatever the number of leases and finished
    runs (production keeps the defaults; tests make them small)."""

    batch: int = 1000  # rows one statement handles
    max_batches: int = 20  # statements of one kind in one pass


# Where the reaper sends a run (the `to` label of runlease_reaped_total).
REAPED_TO = ("pending", "dead", "cancelled")
# The leader lists the pools (for announce_pools) every this many passes.
POOLS_EVERY_PASSES = 60


class Reaper(PeriodicService):
    """The leader's housekeeping pass, every `interval_s`: reaping, retention,
    folding and the economics passes (the module says what each does);
    a process that is not the leader passes by."""

    name = "reaper"

    def __init__(
        self,
        store: RunStore,
        elector: LeaderElector,
        *,
        interval_s: float = 5.0,
        bounds: ReapBounds = ReapBounds(),
        forget_workers_after_s: float = 600.0,
    ) -> None:
        super().__init__(interval_s)
        self.store = store
        self.elector = elector
        self.bounds = bounds
        self.forget_workers_after_s = forget_workers_after_s
        self._passes = 0

    async def run_once(self) -> None:
        if not self.elector.is_leader:
            return
        if self._passes % POOLS_EVERY_PASSES == 0:
            await self.announce_pools()
        await self.reap()
        await self.retain()
        await self.forget_workers()
        await self.store.fold_counts()
        await self.fold_pool_health()
        await self.roll_up_usage()
        await self.wake_parents()
        await self.time_out_inputs()

    async def _in_batches(self, batch: Callable[[], Awaitable[int]]) -> int:
        """`batch()` (one bounded batch: how many rows it did) until a batch is
        short of the bounds' batch or max_batches ran; how many rows in all."""
        total = 0
        for _ in range(self.bounds.max_batches):
            n = await batch()
            total += n
            if n < self.bounds.batch:
                break
        return total

    async def announce_pools(self) -> None:
        """Every pool's reaped counters exist, at 0, before its first reap: a
        counter series born at its first value is a new series to Prometheus,
        not an increase, so rate() (the lease-expiry alert) would miss the
        first burst of expired leases after a leader starts
        (tests/operator/test_prometheus.py found it)."""
        for pool in await self.store.list_pools():
            for to in REAPED_TO:
                metrics.child(metrics.REAPED, pool.name, to)

    async def reap(self) -> int:
        """End the incarnations that stopped renewing and requeue their runs,
        in bounded batches; how many runs went back."""
        self._passes += 1
        total = 0
        for _ in range(self.bounds.max_batches):
            result = await self.store.reap(batch=self.bounds.batch)
            for worker in result.ended:
                log.warning("worker_ended worker=%s: it stopped renewing its lease", worker)
            for run_id, pool, tenant, status in result.reaped:
                metrics.REAPED.labels(pool, status).inc()
                log.warning("run_reaped run_id=%s pool=%s tenant=%s to=%s", run_id, pool,
                            tenant, status)
            total += result.total
            if result.total < self.bounds.batch and len(result.ended) < self.bounds.batch:
                break
        return total

    async def time_out_inputs(self) -> int:
        """Runs waiting for input past their request's timeout go back to
        pending (their wait raises InputTimeout), in bounded batches."""
        async def batch() -> int:
            timed_out = await self.store.time_out_inputs(batch=self.bounds.batch)
            for run_id, pool, tenant, name in timed_out:
                log.info("input_timed_out run_id=%s pool=%s tenant=%s name=%s", run_id, pool,
                         tenant, name)
            return len(timed_out)
        return await self._in_batches(batch)

    async def forget_workers(self) -> int:
        """Delete registry rows of workers gone for a while (the console stops
        listing them; runs they still hold are reaped all the same)."""
        gone = await self.store.delete_stale_workers(self.forget_workers_after_s)
        for worker, pool in gone:
            log.info("worker_forgotten worker=%s pool=%s", worker, pool)
        return len(gone)

    async def fold_pool_health(self) -> int:
        """The stale writes workers reported into their pool's minute (lease
        expiries are counted by the reap itself); minutes past a day go,
        once every 60 passes."""
        n = await self.store.fold_stale_writes()
        if self._passes % 60 == 1:
            await self.store.prune_pool_health()
        return n

    async def retain(self) -> int:
        """Delete finished runs past their pool's retention, in bounded batches."""
        by_pool: dict[str, int] = {}

        async def batch() -> int:
            deleted = await self.store.delete_expired(batch=self.bounds.batch)
            for pool, count in deleted.items():
                by_pool[pool] = by_pool.get(pool, 0) + count
            return sum(deleted.values())
        total = await self._in_batches(batch)
        if total:
            metrics.RETENTION_DELETED.inc(total)
            for pool, count in sorted(by_pool.items()):
                log.info("retention_deleted pool=%s runs=%d", pool, count)
        return total

    async def roll_up_usage(self) -> int:
        """Fold logged usage into the per-tenant, per-pool, per-day rollup."""
        return await self._in_batches(lambda: self.store.usage_rollup(batch=self.bounds.batch))

    async def wake_parents(self) -> int:
        """Parents waiting for children that have all finished become due."""
        total = await self._in_batches(lambda: self.store.wake_parents(batch=self.bounds.batch))
        if total:
            log.info("parents_woken runs=%d", total)
        return total
