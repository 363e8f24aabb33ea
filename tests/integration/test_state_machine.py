"""The transition table against a small model, driven by hypothesis.

Random sequences of enqueue, claim, heartbeat, ack, nack, fail, release,
cancel, reap, redrive, worker shutdown and clock jumps run against the real
store; after every step each run in the database must match the model. A
lease is its holder's worker incarnation: one heartbeat renews all it holds,
the reaper ends an incarnation that expired, and its worker registers a new
one to claim again. Leases are drawn from every lease ever issued, so stale
holders (of an ended incarnation, or of an old epoch) keep trying to write.
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
from runlease.db.workers import Registration
from runlease.errors import IncarnationEnded, LeaseLost

T = TypeVar("T")
LEASE_S = 10
WORKERS = ("w1", "w2")


@dataclass
class Incarnation:
    expires_at: float  # seconds on the test clock
    ended: bool = False

    def live(self, now: float) -> bool:
        return not self.ended and self.expires_at > now


@dataclass
class Model:
    status: str = "pending"
    attempts: int = 0
    max_attempts: int = 1
    epoch: int = 0
    worker: str | None = None  # the holder's incarnation
    cancel: bool = False
    available_at: float = 0.0  # seconds on the test clock


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
        self.incarnations: dict[str, Incarnation] = {}
        self.current: dict[str, str] = {}  # worker -> its incarnation now
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
            conn.execute("TRUNCATE agent_runs, agent_run_workers CASCADE")
        self.run(self.store.upsert_pool(Pool("default", lease_s=LEASE_S)))
        return multiple(*(self.enqueue(n, 0) for n in max_attempts))

    # -- rules ------------------------------------------------------------------

    @rule(target=runs, max_attempts=st.integers(1, 3), priority=st.integers(-1, 1))
    def enqueue(self, max_attempts: int, priority: int) -> UUID:
        result = self.run(self.store.enqueue("default", "t", {}, max_attempts=max_attempts,
                                             priority=priority))
        self.model[result.run.id] = Model(max_attempts=max_attempts, available_at=self.t)
        return result.run.id

    def held_by(self, lease: Lease) -> bool:
        # A lease lives while its holder's incarnation does, reaped yet or
        # not: every fenced write needs the holder's row live by the
        # database clock, and the run's epoch.
        m = self.model[lease.run_id]
        return (m.status == "leased" and m.worker == lease.worker and m.epoch == lease.epoch
                and self.incarnations[lease.worker].live(self.t))

    def register(self, worker: str) -> str:
        name = f"{worker}.{sum(1 for i in self.incarnations if i.startswith(worker + '.'))}"
        self.run(self.store.register_worker(Registration(name, "default", 3), lease_s=LEASE_S))
        self.incarnations[name] = Incarnation(self.t + LEASE_S)
        self.current[worker] = name
        return name

    @rule(target=leases, worker=st.sampled_from(WORKERS), n=st.integers(1, 3))
    def claim(self, worker: str, n: int) -> Any:
        name = self.current.get(worker) or self.register(worker)
        if not self.incarnations[name].live(self.t):
            # An incarnation that is over claims nothing; its worker
            # registers a new one, as a worker's lease keeper does.
            try:
                self.run(self.store.claim("default", name, n))
            except IncarnationEnded:
                pass
            else:
                raise AssertionError(f"{name} claimed after its incarnation was over")
            name = self.register(worker)
        claimable = {i for i, m in self.model.items()
                     if m.status == "pending" and m.available_at <= self.t}
        got = self.run(self.store.claim("default", name, n))
        assert len(got) == min(n, len(claimable))
        for lease in got:
            assert lease.run_id in claimable
            m = self.model[lease.run_id]
            m.status, m.worker = "leased", name
            m.attempts += 1
            m.epoch += 1
            assert (lease.run.attempts, lease.epoch) == (m.attempts, m.epoch)
        return multiple(*got)

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker: str) -> None:
        # One renewal per incarnation, whatever it holds; skipped often
        # enough (other rules) that incarnations expire.
        name = self.current.get(worker)
        if name is None:
            return
        inc = self.incarnations[name]
        result = self.run(self.store.heartbeat(Registration(name, "default", 3),
                                               lease_s=LEASE_S))
        if not inc.live(self.t):
            assert result is None
            return
        assert result is not None
        inc.expires_at = self.t + LEASE_S
        assert result.cancel_requested == {
            i for i, m in self.model.items()
            if m.status == "leased" and m.worker == name and m.cancel}

    @rule(worker=st.sampled_from(WORKERS))
    def shutdown(self, worker: str) -> None:
        # A clean stop ends the incarnation, with whatever it still holds.
        name = self.current.pop(worker, None)
        if name is not None:
            self.run(self.store.deregister_worker(name))
            self.incarnations[name].ended = True

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
        held = self.held_by(lease)
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
        can = self.held_by(lease) and m.cancel
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
        ended = {name for name, inc in self.incarnations.items()
                 if not inc.ended and inc.expires_at < self.t}
        assert set(result.ended) == ended
        for name in ended:
            self.incarnations[name].ended = True
        expected = {i for i, m in self.model.items()
                    if m.status == "leased" and self.incarnations[m.worker or ""].ended}
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
        held = self.held_by(lease)
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
                "SELECT r.id, r.status, r.attempts, r.lease_epoch, r.locked_by,"
                "       r.cancel_requested_at IS NOT NULL, r.available_at, w.expires_at"
                "  FROM agent_runs r LEFT JOIN agent_run_workers w ON w.id = r.locked_by"
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
                holder = self.incarnations[locked_by]
                assert until == start + timedelta(seconds=holder.expires_at)


def test_transitions_match_the_model(db_url: str) -> None:
    QueueMachine.url = db_url
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(max_examples=50, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
