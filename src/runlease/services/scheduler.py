"""The scheduler: enqueues the due ticks of schedules, on the elected leader.

It runs under the reaper's election (the same leader), every second: a tick
is enqueued within about a second of its time while a leader lives. The
store does the work in one transaction per batch (db/schedules.py): the
schedule rows are locked and moved on with the enqueue, and each tick's run
has an idempotency key, so two processes that both believe they lead (one
has not yet noticed it lost) never enqueue one tick twice. After a time
without any leader, each schedule enqueues only its latest missed tick.
"""

from __future__ import annotations

import logging

from runlease import metrics
from runlease.db.store import RunStore
from runlease.services.leader import LeaderElector
from runlease.services.loop import PeriodicService

log = logging.getLogger(__name__)

SCHEDULER_INTERVAL_S = 1.0


class Scheduler(PeriodicService):
    name = "scheduler"

    def __init__(self, store: RunStore, elector: LeaderElector, *,
                 interval_s: float = SCHEDULER_INTERVAL_S, batch: int = 100,
                 max_batches: int = 20) -> None:
        super().__init__(interval_s)
        self.store = store
        self.elector = elector
        self.batch = batch
        self.max_batches = max_batches

    async def run_once(self) -> None:
        if self.elector.is_leader:
            await self.fire()

    async def fire(self) -> int:
        """Handle every due tick (bounded batches); the number handled."""
        total = 0
        for _ in range(self.max_batches):
            ticks = await self.store.fire_due_schedules(batch=self.batch)
            for t in ticks:
                if t.missed:
                    metrics.SCHEDULE_TICKS.labels("missed").inc(t.missed)
                    log.warning("schedule_ticks_missed schedule_id=%s tenant=%s missed=%d",
                                t.schedule_id, t.tenant_id, t.missed)
                if t.run_id is not None:
                    metrics.SCHEDULE_TICKS.labels("enqueued").inc()
                    log.info("schedule_tick_enqueued schedule_id=%s tenant=%s tick=%s "
                             "run_id=%s", t.schedule_id, t.tenant_id, t.tick.isoformat(),
                             t.run_id)
                else:
                    metrics.SCHEDULE_TICKS.labels("skipped").inc()
                    log.warning("schedule_tick_skipped schedule_id=%s tenant=%s tick=%s "
                                "why=%s", t.schedule_id, t.tenant_id, t.tick.isoformat(),
                                t.error)
            total += len(ticks)
            if len(ticks) < self.batch:
                break
        return total
