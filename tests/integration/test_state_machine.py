"""The transition table against a small model, driven by hypothesis.

Random sequences of enqueue, claim, heartbeat, ack, nack, fail, release,
cancel, reap, redrive and clock jumps run against the real store; after every
step each run in the database must match the model. Leases are drawn from
every lease ever issued, so stale holders keep trying to write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from runlease.clock import ManualClock
from runlease.core.backoff import backoff_s
from runlease.db.connect import make_conn_pool
from runlease.db.models import Lease, Pool
from runlease.db.store import RunStore
from runlease.errors import LeaseLost

T = TypeVar("T")
LEASE_S = 10
WORKERS = ("w1", "w2")


@dataclass
class Model:
    status: str = "pending"
    attempts: int = 0
    max_attempts: int = 1
    epoch: int = 0
    worker: str | None = None
    cancel: bool = False
    available_at: float = 0.0  # seconds on the test clock
    locked_until: float = 0.0

    def held_by(self, lease: Lease, now: float) -> bool:
        # An expired lease is no lease, reaped yet or not: every fenced write
        # needs locked_until ahead of the database clock.
        return (self.status == "leased" and self.worker == lease.worker
                and self.epoch == lease.epoch and self.locked_until > now)


class QueueMachine(RuleBasedStateMachine):
    url: str

    runs = Bundle("runs")
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
        self.t = 0.0
        self.model: dict[UUID, Model] = {}
        self.conn_pool = make_conn_pool(self.url, max_size=1)
        self.run(self.conn_pool.open())
        self.store = RunStore(self.conn_pool, clock=self.clock)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.conn_pool.close())
        self.loop.close()

    @initialize(target=runs, max_attempts=st.lists(st.integers(1, 3), min_size=2, max_size=5))
    def clean(self, max_attempts: list[int]) -> Any:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("TRUNCATE agent_runs CASCADE")
        self.run(self.store.upsert_pool(Pool("default", lease_s=LEASE_S)))
        return multiple(*(self.enqueue(n, 0) for n in max_attempts))

    # -- rules ------------------------------------------------------------------

    @rule(target=runs, max_attempts=st.integers(1, 3), priority=st.integers(-1, 1))
    def enqueue(self, max_attempts: int, priority: int) -> UUID:
        result = self.run(self.store.enqueue("default", "t", {}, max_attempts=max_attempts,
                                             priority=priority))
        self.model[result.run.id] = Model(max_attempts=max_attempts, available_at=self.t)
        return result.run.id

    @rule(target=leases, worker=st.sampled_from(WORKERS), n=st.integers(1, 3))
    def claim(self, worker: str, n: int) -> Any:
        claimable = {i for i, m in self.model.items()
                     if m.status == "pending" and m.available_at <= self.t}
        got = self.run(self.store.claim("default", worker, n))
        assert len(got) == min(n, len(claimable))
        for lease in got:
            assert lease.run_id in claimable
            m = self.model[lease.run_id]
            m.status, m.worker, m.locked_until = "leased", worker, self.t + LEASE_S
            m.attempts += 1
            m.epoch += 1
            assert (lease.run.attempts, lease.epoch) == (m.attempts, m.epoch)
        return multiple(*got)

    @rule(worker=st.sampled_from(WORKERS), chosen=st.lists(leases, max_size=4))
    def heartbeat(self, worker: str, chosen: list[Lease]) -> None:
        # Renew only some leases, current or stale, so others get to expire.
        pairs = sorted({(lease.run_id, lease.epoch) for lease in chosen})
        held = {i for i, epoch in pairs
                if self.model[i].status == "leased" and self.model[i].worker == worker
                and self.model[i].epoch == epoch and self.model[i].locked_until > self.t}
        result = self.run(self.store.heartbeat(worker, pairs))
        assert set(result.held) == held
        assert result.cancel_requested == {i for i in held if self.model[i].cancel}
        for i in held:
            self.model[i].locked_until = self.t + LEASE_S

    @rule(lease=leases)
    def ack(self, lease: Lease) -> None:
        m = self.model[lease.run_id]
        if self._fenced(lease, self.store.ack(lease, {"ok": 1})):
            m.status, m.worker = "done", None

    @rule(lease=leases)
    def nack(self, lease: Lease) -> None:
        m = self.model[lease.run_id]
        if self._fenced(lease, self.store.nack(lease, "retryable", "x")):
            m.worker = None
            if m.cancel:
                m.status = "cancelled"
            elif m.attempts >= m.max_attempts:
                m.status = "dead"
            else:
                m.status, m.available_at = "pending", self.t + backoff_s(m.attempts)

    @rule(lease=leases)
    def fail(self, lease: Lease) -> None:
        m = self.model[lease.run_id]
        if self._fenced(lease, self.store.fail(lease, "fatal", "x")):
            m.status, m.worker = "dead", None

    @rule(lease=leases)
    def release(self, lease: Lease) -> None:
        m = self.model[lease.run_id]
        held = m.held_by(lease, self.t)
        result = self.run(self.store.release(lease.worker, [(lease.run_id, lease.epoch)]))
        assert bool(result) == held
        if held:
            m.worker, m.available_at = None, self.t
            if m.cancel:
                m.status = "cancelled"
            else:
                m.status, m.attempts = "pending", m.attempts - 1

    @rule(lease=leases)
    def finalize_cancel(self, lease: Lease) -> None:
        m = self.model[lease.run_id]
        can = m.held_by(lease, self.t) and m.cancel
        try:
            self.run(self.store.finalize_cancel(lease))
        except LeaseLost:
            assert not can
        else:
            assert can
            m.status, m.worker = "cancelled", None

    @rule(run_id=runs)
    def request_cancel(self, run_id: UUID) -> None:
        m = self.model[run_id]
        self.run(self.store.request_cancel(run_id))
        if m.status == "pending":
            m.status, m.cancel = "cancelled", True
        elif m.status == "leased":
            m.cancel = True

    @rule(seconds=st.sampled_from([1, 4, 11, 60, 400]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)
        self.t += seconds

    @rule(seconds=st.sampled_from([11, 60, 400]))
    def expire_and_reap(self, seconds: int) -> None:
        self.advance(seconds)
        self.reap()

    @rule()
    def reap(self) -> None:
        result = self.run(self.store.reap())
        expected = {i for i, m in self.model.items()
                    if m.status == "leased" and m.locked_until < self.t}
        assert {r[0] for r in result.reaped} == expected
        for i in expected:
            m = self.model[i]
            m.worker, m.available_at = None, self.t
            if m.cancel:
                m.status = "cancelled"
            elif m.attempts >= m.max_attempts:
                m.status = "dead"
            else:
                m.status = "pending"

    @rule(run_id=runs)
    def redrive(self, run_id: UUID) -> None:
        m = self.model[run_id]
        try:
            self.run(self.store.redrive(run_id))
        except Exception:
            assert m.status != "dead"
        else:
            assert m.status == "dead"
            m.status, m.attempts, m.cancel, m.available_at = "pending", 0, False, self.t

    def _fenced(self, lease: Lease, write: Coroutine[Any, Any, Any]) -> bool:
        held = self.model[lease.run_id].held_by(lease, self.t)
        try:
            self.run(write)
        except LeaseLost:
            assert not held
            return False
        assert held
        return True

    # -- the database matches the model after every step ------------------------

    @invariant()
    def database_matches_model(self) -> None:
        if not self.model:
            return
        with psycopg.connect(self.url) as conn:
            rows = conn.execute(
                "SELECT id, status, attempts, lease_epoch, locked_by,"
                " cancel_requested_at IS NOT NULL, available_at, locked_until FROM agent_runs"
            ).fetchall()
        assert len(rows) == len(self.model)
        start = datetime(2030, 1, 1, tzinfo=UTC)
        for run_id, status, attempts, epoch, locked_by, cancel, available, until in rows:
            m = self.model[run_id]
            assert (status, attempts, epoch, locked_by, cancel) == (
                m.status, m.attempts, m.epoch, m.worker, m.cancel), run_id
            assert attempts <= m.max_attempts
            if status == "pending":
                assert available == start + timedelta(seconds=m.available_at)
            if status == "leased":
                assert until == start + timedelta(seconds=m.locked_until)


def test_transitions_match_the_model(db_url: str) -> None:
    QueueMachine.url = db_url
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(max_examples=50, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
