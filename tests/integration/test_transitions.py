"""Every transition of the state machine against a real PostgreSQL."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from uuid import UUID

import psycopg
import pytest

from runlease.clock import ManualClock
from runlease.core.backoff import backoff_s
from runlease.core.states import RunStatus
from runlease.db.channels import CANCEL_CHANNEL, EVENTS_CHANNEL, pool_channel
from runlease.db.models import Lease, Pool
from runlease.db.store import NewRun, RunStore
from runlease.errors import (
    IdempotencyConflict,
    InvalidTransition,
    LeaseLost,
    RunNotFound,
    UnknownPool,
)


async def count_runs(store: RunStore) -> int:
    """How many runs the table holds."""
    async with store.connection() as c:
        row = await (await c.execute("SELECT count(*) AS n FROM agent_runs")).fetchone()
    assert row is not None
    return int(row["n"])


async def claim_one(store: RunStore, worker: str = "w1", pool: str = "default") -> Lease:
    (lease,) = await store.claim(pool, worker, 1)
    return lease


# -- enqueue -----------------------------------------------------------------


async def test_enqueue_stores_a_pending_run_with_pool_defaults(store: RunStore) -> None:
    await store.upsert_pool(Pool("batch", max_attempts=7, lease_s=30))
    result = await store.enqueue(
        "batch", "acme", {"prompt": "hi"}, priority=5, budget={"max_turns": 3}
    )
    run = result.run
    assert result.inserted
    assert (run.status, run.pool, run.tenant_id, run.priority) == ("pending", "batch", "acme", 5)
    assert (run.attempts, run.max_attempts, run.lease_epoch) == (0, 7, 0)
    assert run.input_json == {"prompt": "hi"}
    assert run.budget_json == {"max_turns": 3}
    assert run.finished_at is None
    assert run.locked_by is None
    assert await store.get(run.id) == run


async def test_idempotency_key_returns_the_existing_run(store: RunStore) -> None:
    first = await store.enqueue("default", "acme", {"q": 1}, idempotency_key="order-42")
    again = await store.enqueue("default", "acme", {"q": 1}, idempotency_key="order-42")
    assert first.inserted
    assert not again.inserted
    assert again.run.id == first.run.id
    # The same key of another tenant is another run.
    other = await store.enqueue("default", "globex", {"q": 1}, idempotency_key="order-42")
    assert other.inserted
    assert other.run.id != first.run.id
    assert await count_runs(store) == 2


async def test_idempotency_key_with_another_input_is_a_conflict(store: RunStore) -> None:
    first = await store.enqueue("default", "acme", {"q": 1}, idempotency_key="k")
    with pytest.raises(IdempotencyConflict) as err:
        await store.enqueue_many(
            "default",
            [
                NewRun("acme", {"fresh": True}),
                NewRun("acme", {"q": 2}, idempotency_key="k"),
            ],
        )
    assert err.value.run_id == first.run.id
    assert await count_runs(store) == 1  # the batch wrote nothing


async def test_concurrent_enqueues_with_one_key_make_one_run(db_url: str) -> None:
    from runlease.db.connect import make_conn_pool

    async with make_conn_pool(db_url, max_size=8) as conn_pool:
        store = RunStore(conn_pool)
        results = await asyncio.gather(
            *(store.enqueue("default", "acme", {"q": 1}, idempotency_key="same") for _ in range(8))
        )
    assert len({r.run.id for r in results}) == 1
    assert sum(r.inserted for r in results) == 1


async def test_unknown_pool_is_a_clear_error(store: RunStore) -> None:
    with pytest.raises(UnknownPool, match="nope"):
        await store.enqueue("nope", "acme", {})
    assert await count_runs(store) == 0


async def test_batch_enqueue_keeps_order_and_notifies_once(store: RunStore, db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute(f'LISTEN "{pool_channel("default")}"')
        results = await store.enqueue_many(
            "default", [NewRun(f"t{i % 3}", {"n": i}) for i in range(50)]
        )
        got = [n async for n in _notifies(listener, 1)]
    assert [r.run.input_json["n"] for r in results] == list(range(50))
    assert all(r.inserted for r in results)
    assert got[0].channel == pool_channel("default")
    assert got[0].payload == "default"


async def _notifies(conn: psycopg.AsyncConnection, n: int, wait_s: float = 5.0):  # type: ignore[no-untyped-def]
    seen = 0
    async with asyncio.timeout(wait_s):
        async for notify in conn.notifies():
            yield notify
            seen += 1
            if seen == n:
                return


# -- claim and leases ----------------------------------------------------------


async def test_claim_leases_and_mints_a_fencing_token(store: RunStore, clock: ManualClock) -> None:
    await store.upsert_pool(Pool("p", lease_s=30))
    queued = await store.enqueue("p", "acme", {})
    (lease,) = await store.claim("p", "worker-a", 5)
    run = lease.run
    assert run.id == queued.run.id
    assert (run.status, run.attempts, run.lease_epoch, run.locked_by) == (
        "leased",
        1,
        1,
        "worker-a",
    )
    assert run.locked_until == clock.db_now() + timedelta(seconds=30)
    assert await store.claim("p", "worker-b", 5) == []
    # The lease is the holder's: a worker registered with its own lease
    # length holds what it claims for that long.
    await store.enqueue("p", "acme", {})
    (short,) = await store.claim("p", "worker-c", 1, lease_s=5)
    assert short.run.locked_until == clock.db_now() + timedelta(seconds=5)


async def test_claim_takes_a_batch_in_priority_order(store: RunStore) -> None:
    await store.upsert_pool(Pool("default", priority_aging_s=0))
    for p in (0, 10, -5, 10, 3):
        await store.enqueue("default", "acme", {"p": p}, priority=p)
    leases = await store.claim("default", "w", 10)
    assert [lease.run.priority for lease in leases] == [10, 10, 3, 0, -5]


async def test_heartbeat_renews_held_leases_and_reports_lost_ones(
    store: RunStore, clock: ManualClock
) -> None:
    # One renewal of the holder's row renews every lease it holds.
    await store.enqueue_many("default", [NewRun("acme", {}) for _ in range(3)])
    a, b = await store.claim("default", "w1", 2)
    (c,) = await store.claim("default", "w2", 1)
    clock.advance(10)
    result = await store.renew("w1")
    assert result is not None
    assert result.expires_at == clock.db_now() + timedelta(seconds=45)
    assert result.cancel_requested == frozenset()
    for lease in (a, b):
        assert (await store.get(lease.run_id)).locked_until == result.expires_at
    # Another holder's leases are not renewed by it.
    assert (await store.get(c.run_id)).locked_until == clock.db_now() + timedelta(seconds=35)
    # A name never registered renews nothing.
    assert await store.renew("w-unknown") is None


async def test_ack_finishes_the_run_with_its_result(store: RunStore) -> None:
    await store.enqueue("default", "acme", {})
    lease = await claim_one(store)
    await store.ack(lease, {"answer": 42})
    run = await store.get(lease.run_id)
    assert (run.status, run.result_json, run.locked_by) == ("done", {"answer": 42}, None)
    assert run.finished_at is not None
    with pytest.raises(LeaseLost):
        await store.ack(lease)


async def test_ack_many_acks_a_batch_and_reports_lost_leases(store: RunStore) -> None:
    await store.enqueue_many("default", [NewRun("acme", {}) for _ in range(5)])
    leases = await store.claim("default", "w1", 5)
    stale = Lease(replace(leases[0].run, lease_epoch=99), "w1")
    lost = await store.ack_many([(stale, None)] + [(lease, {"i": 1}) for lease in leases[1:]])
    assert lost == {leases[0].run_id}
    statuses = [(await store.get(lease.run_id)).status for lease in leases]
    assert statuses == ["leased", "done", "done", "done", "done"]


async def test_backoff_is_computed_by_the_database_and_ends_dead(
    store: RunStore, clock: ManualClock
) -> None:
    await store.enqueue("default", "acme", {}, max_attempts=4)
    delays = []
    for attempt in range(1, 5):
        lease = await claim_one(store)
        assert lease.run.attempts == attempt
        status = await store.nack(lease, "retryable", f"failure {attempt}")
        run = await store.get(lease.run_id)
        if attempt < 4:
            assert status == RunStatus.PENDING
            delays.append((run.available_at - clock.db_now()).total_seconds())
            # Not claimable before its backoff has passed.
            clock.advance(delays[-1] - 0.5)
            assert await store.claim("default", "w1", 1) == []
            clock.advance(0.5)
        else:
            assert status == RunStatus.DEAD
            assert (run.status, run.error_code, run.error_message) == (
                "dead",
                "retryable",
                "failure 4",
            )
            assert run.finished_at == clock.db_now()
    assert delays == [backoff_s(1), backoff_s(2), backoff_s(3)] == [5, 10, 20]
    assert await store.claim("default", "w1", 1) == []


async def test_a_retry_after_longer_than_the_backoff_wins(
    store: RunStore, clock: ManualClock
) -> None:
    await store.enqueue("default", "acme", {}, max_attempts=3)
    lease = await claim_one(store)
    await store.nack(lease, "model_unavailable", "429", retry_after_s=42)
    run = await store.get(lease.run_id)
    assert (run.available_at - clock.db_now()).total_seconds() == 42
    clock.advance(42)
    lease = await claim_one(store)
    await store.nack(lease, "model_unavailable", "429", retry_after_s=1)  # backoff (10 s) wins
    run = await store.get(lease.run_id)
    assert (run.available_at - clock.db_now()).total_seconds() == 10


def test_backoff_formula_caps_at_five_minutes() -> None:
    assert [backoff_s(a) for a in (1, 2, 3, 4, 5, 6, 7, 50)] == [5, 10, 20, 40, 80, 160, 300, 300]


async def test_backoff_cap_in_sql(store: RunStore, clock: ManualClock) -> None:
    await store.enqueue("default", "acme", {}, max_attempts=20)
    for i in range(9):
        # Time jumps past any lease: a new worker incarnation each attempt.
        lease = await claim_one(store, f"w{i}")
        await store.nack(lease, "retryable", "again")
        run = await store.get(lease.run_id)
        assert (run.available_at - clock.db_now()).total_seconds() == backoff_s(run.attempts)
        clock.advance(301)
    assert run.attempts == 9
    assert backoff_s(9) == 300


async def test_fail_is_dead_at_once(store: RunStore) -> None:
    await store.enqueue("default", "acme", {}, max_attempts=5)
    lease = await claim_one(store)
    await store.fail(lease, "fatal", "bad input")
    run = await store.get(lease.run_id)
    assert (run.status, run.attempts, run.error_code) == ("dead", 1, "fatal")


async def test_release_hands_back_without_charging_the_attempt(
    store: RunStore, db_url: str
) -> None:
    await store.enqueue("default", "acme", {}, max_attempts=1)
    lease = await claim_one(store)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute(f'LISTEN "{pool_channel("default")}"')
        released = await store.release("w1", [(lease.run_id, lease.epoch)])
        assert [n.payload async for n in _notifies(listener, 1)] == ["default"]
    assert released == {lease.run_id: RunStatus.PENDING}
    run = await store.get(lease.run_id)
    assert (run.status, run.attempts, run.locked_by) == ("pending", 0, None)
    again = await claim_one(store, "w2")  # at once, and max_attempts=1 still allows it
    assert (again.run.attempts, again.epoch) == (1, 2)


async def test_cancel_of_a_pending_run_is_immediate(store: RunStore) -> None:
    queued = await store.enqueue("default", "acme", {})
    run = await store.request_cancel(queued.run.id)
    assert run.status == "cancelled"
    assert run.finished_at is not None
    assert await store.claim("default", "w1", 1) == []
    events = await store.events_after(run.id)
    assert [e.kind for e in events] == ["run.cancelled"]


async def test_cancel_of_a_leased_run_notifies_and_is_finalized(
    store: RunStore, db_url: str
) -> None:
    await store.enqueue("default", "acme", {})
    lease = await claim_one(store)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute(f'LISTEN "{CANCEL_CHANNEL}"')
        run = await store.request_cancel(lease.run_id)
        assert [n.payload async for n in _notifies(listener, 1)] == [str(lease.run_id)]
    assert run.status == "leased"
    assert run.cancel_requested_at is not None
    hb = await store.renew("w1")
    assert hb is not None
    assert hb.cancel_requested == {lease.run_id}
    await store.finalize_cancel(lease)
    run = await store.get(lease.run_id)
    assert (run.status, run.attempts) == ("cancelled", 1)
    # Stop on a finished run changes nothing.
    assert (await store.request_cancel(lease.run_id)).status == "cancelled"


async def test_a_cancelled_run_is_never_retried(store: RunStore, clock: ManualClock) -> None:
    await store.enqueue_many("default", [NewRun("acme", {}) for _ in range(3)])
    a, b, c = await store.claim("default", "w1", 3)
    for lease in (a, b, c):
        await store.request_cancel(lease.run_id)
    assert await store.nack(a, "retryable", "x") == RunStatus.CANCELLED
    assert await store.release("w1", [(b.run_id, b.epoch)]) == {b.run_id: RunStatus.CANCELLED}
    clock.advance(3600)
    reaped = await store.reap()
    assert (reaped.to_cancelled, reaped.to_pending) == (1, 0)
    assert {(await store.get(x.run_id)).status for x in (a, b, c)} == {"cancelled"}


async def test_finalize_cancel_without_a_request_is_refused(store: RunStore) -> None:
    await store.enqueue("default", "acme", {})
    lease = await claim_one(store)
    with pytest.raises(LeaseLost):
        await store.finalize_cancel(lease)
    assert (await store.get(lease.run_id)).status == "leased"


async def test_claim_never_returns_a_cancel_requested_run(store: RunStore) -> None:
    await store.enqueue_many("default", [NewRun("acme", {"i": i}) for i in range(4)])
    first = await store.claim("default", "w1", 2)
    for lease in first:
        await store.request_cancel(lease.run_id)
    await store.request_cancel((await store.list_runs(status="pending"))[0].id)
    rest = await store.claim("default", "w2", 10)
    assert len(rest) == 1
    assert rest[0].run.cancel_requested_at is None


async def test_reap_returns_expired_leases_to_pending(store: RunStore, clock: ManualClock) -> None:
    await store.upsert_pool(Pool("default", lease_s=10))
    await store.enqueue_many("default", [NewRun("acme", {}) for _ in range(3)])
    (a,) = await store.claim("default", "w1", 1)
    b, c = await store.claim("default", "w2", 2)
    clock.advance(8)
    assert await store.renew("w1", lease_s=10) is not None
    clock.advance(3)  # w2 expired one second ago, w1 was renewed
    result = await store.reap()
    assert (result.to_pending, result.to_dead) == (2, 0)
    assert {r[0] for r in result.reaped} == {b.run_id, c.run_id}
    assert result.ended == ("w2",)
    # An ended incarnation never renews again, even before its row would
    # have been deleted.
    assert await store.renew("w2", lease_s=10) is None
    run = await store.get(b.run_id)
    assert (run.status, run.attempts, run.error_code) == ("pending", 1, "lease_expired")
    assert (await store.get(a.run_id)).status == "leased"
    assert "run.lease_expired" in [e.kind for e in await store.events_after(b.run_id)]


async def test_reap_is_dead_with_lease_expired_at_max_attempts(
    store: RunStore, clock: ManualClock
) -> None:
    await store.enqueue("default", "acme", {}, max_attempts=2)
    for expected in ("pending", "dead"):
        lease = await claim_one(store, f"w-{expected}")
        clock.advance(46)
        result = await store.reap()
        assert result.total == 1
        run = await store.get(lease.run_id)
        assert run.status == expected
    assert (run.error_code, run.attempts) == ("lease_expired", 2)


async def test_reap_works_in_bounded_batches(store: RunStore, clock: ManualClock) -> None:
    await store.enqueue_many("default", [NewRun("acme", {}) for _ in range(25)])
    await store.claim("default", "w1", 25)
    clock.advance(100)
    sizes = [(await store.reap(batch=10)).total for _ in range(4)]
    assert sizes == [10, 10, 5, 0]


async def test_redrive_returns_a_dead_run_to_pending(store: RunStore) -> None:
    await store.enqueue("default", "acme", {}, max_attempts=1)
    lease = await claim_one(store)
    await store.nack(lease, "retryable", "x")
    run = await store.redrive(lease.run_id)
    assert (run.status, run.attempts, run.error_code, run.finished_at) == ("pending", 0, None, None)
    with pytest.raises(InvalidTransition):
        await store.redrive(lease.run_id)
    with pytest.raises(RunNotFound):
        await store.redrive(UUID(int=1))
    assert (await claim_one(store)).run.attempts == 1


async def test_tenant_scope_hides_other_tenants_runs(store: RunStore) -> None:
    mine = (await store.enqueue("default", "acme", {})).run
    with pytest.raises(RunNotFound):
        await store.get(mine.id, tenant_id="globex")
    with pytest.raises(RunNotFound):
        await store.request_cancel(mine.id, tenant_id="globex")
    assert (await store.get(mine.id)).status == "pending"
    assert await store.list_runs(tenant_id="globex") == []


async def test_list_pages_by_keyset(store: RunStore) -> None:
    await store.enqueue_many(
        "default", [NewRun("acme" if i % 2 else "globex", {"i": i}) for i in range(25)]
    )
    seen: list[int] = []
    before = None
    while page := await store.list_runs(tenant_id="acme", limit=4, before=before):
        seen += [r.input_json["i"] for r in page]
        before = page[-1].id
    assert seen == sorted(range(1, 25, 2), reverse=True)
    assert len(await store.list_runs(status="pending", limit=100)) == 25
    assert await store.list_runs(status="done") == []


# -- events and steps --------------------------------------------------------


async def test_events_get_increasing_seq_and_notify(store: RunStore, db_url: str) -> None:
    await store.enqueue("default", "acme", {})
    lease = await claim_one(store)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute(f'LISTEN "{EVENTS_CHANNEL}"')
        assert await store.record_event(lease, "message", {"text": "a"}) == 1
        assert (
            await store.record_events(lease, [("tool.call", {"n": 1}), ("tool.result", {"n": 2})])
            == 3
        )
        payloads = [n.payload async for n in _notifies(listener, 2)]
    assert payloads == [f"{lease.run_id}:1", f"{lease.run_id}:3"]
    events = await store.events_after(lease.run_id)
    assert [(e.seq, e.kind) for e in events] == [
        (1, "message"),
        (2, "tool.call"),
        (3, "tool.result"),
    ]
    assert [e.seq for e in await store.events_after(lease.run_id, after=1)] == [2, 3]


async def test_steps_are_recorded_once(store: RunStore) -> None:
    await store.enqueue("default", "acme", {})
    lease = await claim_one(store)
    assert await store.record_step(lease, "fetch", {"rows": 3}) == {"rows": 3}
    # A second write of the key keeps and returns the first result.
    assert await store.record_step(lease, "fetch", {"rows": 99}) == {"rows": 3}
    # Step results are redacted like events: they hold what tools printed.
    assert await store.record_step(lease, "env", {"out": "token sk-abcdefghijklmnopqrstu"}) == {
        "out": "token [REDACTED]"}
    steps = await store.get_steps(lease.run_id)
    assert steps["fetch"].result == {"rows": 3}
    assert (steps["fetch"].lease_epoch, steps["fetch"].attempt) == (1, 1)


# -- fencing -----------------------------------------------------------------


async def test_an_old_holder_changes_nothing_after_reap_and_reclaim(
    store: RunStore, clock: ManualClock
) -> None:
    await store.enqueue("default", "acme", {}, max_attempts=3)
    old = await claim_one(store, "w-old")
    await store.record_event(old, "message", {"n": 1})
    await store.record_step(old, "s1", {"by": "old"})
    clock.advance(46)
    assert (await store.reap()).to_pending == 1
    new = await claim_one(store, "w-new")
    assert new.epoch == old.epoch + 1
    before = await store.get(new.run_id)
    events_before = await store.events_after(new.run_id)

    # The old incarnation was ended by the reap: it never renews again.
    assert await store.renew("w-old") is None
    # A live holder with a stale epoch too: the epoch alone fences a worker
    # that lost and regained the run.
    same_name = Lease(old.run, "w-new")
    for stale in (old, same_name):
        with pytest.raises(LeaseLost):
            await store.ack(stale, {"by": "old"})
        with pytest.raises(LeaseLost):
            await store.nack(stale, "retryable", "late")
        with pytest.raises(LeaseLost):
            await store.fail(stale, "fatal", "late")
        with pytest.raises(LeaseLost):
            await store.record_event(stale, "message", {"late": True})
        with pytest.raises(LeaseLost):
            await store.record_step(stale, "s2", {"by": "old"})
        with pytest.raises(LeaseLost):
            await store.finalize_cancel(stale)
        assert await store.release(stale.worker, [(stale.run_id, stale.epoch)]) == {}

    assert await store.get(new.run_id) == before
    assert await store.events_after(new.run_id) == events_before
    assert set(await store.get_steps(new.run_id)) == {"s1"}
    await store.ack(new, {"by": "new"})
    assert (await store.get(new.run_id)).result_json == {"by": "new"}
