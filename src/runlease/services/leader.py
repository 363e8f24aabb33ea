"""Leader election through PostgreSQL: a leader row with a term and a TTL.

Whoever finds the row expired takes it (the term grows); the leader renews
it every ttl/3. The leader also fences itself: it stops calling itself leader
when ttl minus a margin has passed on its own monotonic clock since its last
successful renewal, so a leader cut off from the database steps down before
anyone else can be elected. It works the same in the operator, in workers,
in `runlease dev` and in tests, with no Kubernetes API involved.
"""

from __future__ import annotations

import logging

from runlease import metrics
from runlease.clock import Clock, SystemClock
from runlease.db.store import RunStore
from runlease.errors import RunleaseError
from runlease.services.loop import PeriodicService

log = logging.getLogger(__name__)


class LeaderElector(PeriodicService):
    def __init__(
        self,
        store: RunStore,
        identity: str,
        *,
        role: str = "reaper",
        ttl_s: float = 15.0,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(ttl_s / 3)
        self.name = f"leader-{role}"
        self.store = store
        self.identity = identity
        self.role = role
        self.ttl_s = ttl_s
        self.clock = clock or SystemClock()
        self.term: int | None = None
        self._valid_until = 0.0

    @property
    def is_leader(self) -> bool:
        return self.term is not None and self.clock.monotonic() < self._valid_until

    async def run_once(self) -> None:
        started = self.clock.monotonic()
        was = self.is_leader
        try:
            if self.term is not None:
                if await self.store.leader_renew(self.role, self.identity, self.term,
                                                 self.ttl_s):
                    self._valid_until = started + self.ttl_s * 0.9
                else:
                    log.warning("leader_lost role=%s term=%s", self.role, self.term)
                    self.term = None
            if self.term is None:
                term = await self.store.leader_acquire(self.role, self.identity, self.ttl_s)
                if term is not None:
                    self.term = term
                    self._valid_until = started + self.ttl_s * 0.9
                    log.info("leader_elected role=%s term=%s", self.role, term)
        except RunleaseError as exc:
            log.warning("leader_election_failed role=%s error=%s", self.role, exc)
        self._changed(was)

    def _changed(self, was: bool) -> None:
        now = self.is_leader
        metrics.LEADER.labels(self.role).set(1 if now else 0)
        if now != was:
            metrics.LEADER_CHANGES.labels(self.role, "gained" if now else "lost").inc()

    async def on_stop(self) -> None:
        await self.resign()

    async def resign(self) -> None:
        """Hand the role over at once (on a clean shutdown)."""
        term, self.term = self.term, None
        if term is None:
            return
        try:
            await self.store.leader_resign(self.role, self.identity, term)
            log.info("leader_resigned role=%s term=%s", self.role, term)
        except RunleaseError as exc:
            log.warning("leader_resign_failed role=%s error=%s", self.role, exc)
        self._changed(True)
