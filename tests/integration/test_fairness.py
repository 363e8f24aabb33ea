"""Fairness between tenants, priority aging, and limits that skip without blocking."""

from __future__ import annotations

import pytest

from runlease.clock import ManualClock
from runlease.db.models import Pool
from runlease.db.store import NewRun, RunStore


async def claim_order(store: RunStore, pool: str, claims: int, batch: int = 1) -> list[str]:
    order: list[str] = []
    while len(order) < claims:
        leases = await store.claim(pool, "w", batch)
        if not leases:
            break
        order += [lease.run.tenant_id for lease in leases]
        await store.ack_many([(lease, None) for lease in leases])
    return order


async def test_a_small_tenant_is_not_queued_behind_a_big_one(store: RunStore) -> None:
    await store.enqueue_many("default", [NewRun("big", {"i": i}) for i in range(10_000)])
    await store.enqueue_many("default", [NewRun("small", {"i": i}) for i in range(10)])
    order = await claim_order(store, "default", 20)
    # Served in turn: the small tenant's 10 runs are the even claims 2..20.
    assert [i for i, t in enumerate(order, start=1) if t == "small"] == list(range(2, 21, 2))


async def test_fair_order_holds_in_batches_and_for_late_arrivals(store: RunStore) -> None:
    await store.enqueue_many("default", [NewRun("big", {}) for _ in range(1000)])
    first = await claim_order(store, "default", 100, batch=10)
    assert set(first) == {"big"}
    # A tenant arriving after 100 claims joins at the head, not behind 900 runs.
    await store.enqueue_many("default", [NewRun("late", {}) for _ in range(5)]
                             + [NewRun("later", {}) for _ in range(5)])
    order = await claim_order(store, "default", 30, batch=10)
    assert order[:15].count("late") == 5
    assert order[:15].count("later") == 5
    # And the big tenant, appending more, goes to the end of its own line only.
    await store.enqueue_many("default", [NewRun("big", {"new": True})])
    rest = await claim_order(store, "default", 10_000, batch=50)
    assert len(first) + len(order) + len(rest) == 1011


async def test_three_tenants_share_in_turn(store: RunStore) -> None:
    for tenant, n in (("a", 300), ("b", 30), ("c", 3)):
        await store.enqueue_many("default", [NewRun(tenant, {}) for _ in range(n)])
    order = await claim_order(store, "default", 9)
    assert sorted(order) == ["a", "a", "a", "b", "b", "b", "c", "c", "c"]
    order += await claim_order(store, "default", 60)
    assert order[:63].count("b") == 30  # b done within 63 claims though a has 300
    assert order[:69].count("a") == 36


async def test_priority_aging_lets_a_waiting_low_priority_run_through(
    store: RunStore, clock: ManualClock
) -> None:
    # One priority point per 10 s of waiting.
    await store.upsert_pool(Pool("default", priority_aging_s=10))
    await store.enqueue("default", "t", {"low": True}, priority=0)

    clock.advance(20)  # low is worth 0 + 2 = 2 < 5: high goes first
    await store.enqueue_many("default", [NewRun("t", {"low": False}, priority=5)])
    (lease,) = await store.claim("default", "w", 1)
    assert lease.run.input_json == {"low": False}

    clock.advance(40)  # low has waited 60 s: worth 6 > 5 of fresh high runs
    await store.enqueue_many("default", [NewRun("t", {"low": False}, priority=5)
                                         for _ in range(3)])
    (lease,) = await store.claim("default", "w", 1)
    assert lease.run.input_json == {"low": True}


async def test_without_aging_priorities_are_strict(store: RunStore, clock: ManualClock) -> None:
    await store.upsert_pool(Pool("default", priority_aging_s=0))
    await store.enqueue("default", "t", {"low": True}, priority=0)
    clock.advance(86_400)
    await store.enqueue_many("default", [NewRun("t", {"low": False}, priority=1)
                                         for _ in range(3)])
    leases = await store.claim("default", "w", 4)
    assert [lease.run.input_json["low"] for lease in leases] == [False, False, False, True]


async def claims_until_patient_runs(
    store: RunStore, clock: ManualClock, arrivals_per_claim: int, patient: str = "busy"
) -> int:
    await store.enqueue("default", patient, {}, priority=-10)
    claims = 0
    while True:
        # Fresh priority-10 runs arrive every second; one claim a second.
        await store.enqueue_many("default", [NewRun("busy", {"busy": True}, priority=10)
                                             for _ in range(arrivals_per_claim)])
        clock.advance(1)
        (lease,) = await store.claim("default", "w", 1)
        await store.ack(lease)
        assert await store.renew("w") is not None  # as its lease keeper would
        claims += 1
        if not lease.run.input_json:
            return claims
        assert claims < 1000, "the low-priority run starved"


async def test_low_priority_cannot_starve_under_a_steady_high_stream(
    store: RunStore, clock: ManualClock
) -> None:
    await store.upsert_pool(Pool("default", priority_aging_s=5))
    # One tenant's own runs: the high runs are served as they come, each waits
    # 1 s (worth 10.2): the patient run needs 20.2 points, 101 s of waiting,
    # then it wins.
    assert 101 <= await claims_until_patient_runs(store, clock, 1) <= 103


async def test_low_priority_gets_through_an_overload_too(
    store: RunStore, clock: ManualClock
) -> None:
    await store.upsert_pool(Pool("default", priority_aging_s=5))
    # Twice as many high runs arrive as are served: their backlog ages at half
    # the patient run's pace, so it catches up after about 200 claims.
    assert 195 <= await claims_until_patient_runs(store, clock, 2) <= 205


async def test_another_tenants_high_priority_stream_does_not_delay_a_low_run(
    store: RunStore, clock: ManualClock
) -> None:
    # Priority orders a tenant's own runs only: another tenant's priority-10
    # stream is served in turn with the patient tenant's priority -10 run,
    # with aging off (it would otherwise take 101 claims, as above).
    await store.upsert_pool(Pool("default", priority_aging_s=0))
    await store.enqueue_many("default", [NewRun("busy", {"busy": True}, priority=10)
                                         for _ in range(50)])
    assert await claims_until_patient_runs(store, clock, 1, patient="patient") <= 2


# B's share of the first 100 claims, in a pool where A flooded at priority
# 100 and B submitted at 0: the fair share is 50; the bound allows for the
# order of ties at the head.
FAIR_SHARE_MIN = 45


@pytest.mark.parametrize("batch", [1, 10])
async def test_a_flood_at_top_priority_does_not_jump_the_fair_share(
    store: RunStore, batch: int
) -> None:
    await store.enqueue_many("default", [NewRun("a", {}, priority=100) for _ in range(500)])
    await store.enqueue_many("default", [NewRun("b", {}, priority=0) for _ in range(50)])
    order = await claim_order(store, "default", 100, batch=batch)
    assert len(order) == 100
    assert order.count("b") >= FAIR_SHARE_MIN


async def test_a_tenant_cannot_hold_its_place_with_one_old_low_run(store: RunStore) -> None:
    # A's oldest run (priority -100) holds A's place at the head of the fair
    # order; A's high runs fill that place. The held place must move with
    # them, or A would be at the head at every claim and take them all.
    await store.enqueue("default", "a", {"old": True}, priority=-100)
    await store.enqueue_many("default", [NewRun("a", {}, priority=100) for _ in range(200)])
    await store.enqueue_many("default", [NewRun("b", {}) for _ in range(50)])
    for batch in (1, 7):
        order = await claim_order(store, "default", 50, batch=batch)
        assert order.count("b") >= 23, (batch, order)


async def test_priority_orders_a_tenants_own_runs(store: RunStore) -> None:
    await store.upsert_pool(Pool("default", priority_aging_s=0))
    await store.enqueue_many("default", [NewRun("a", {"p": p}, priority=p) for p in (0, 5, -5)])
    await store.enqueue_many("default", [NewRun("b", {"p": p}, priority=p) for p in (1, 2)])
    leases = await store.claim("default", "w", 5)
    mine = [(lease.run.tenant_id, lease.run.input_json["p"]) for lease in leases]
    assert [p for t, p in mine if t == "a"] == [5, 0, -5]
    assert [p for t, p in mine if t == "b"] == [2, 1]
    # And in turn: a, b, a, b, a.
    assert [t for t, _ in mine] == ["a", "b", "a", "b", "a"]


async def test_a_tenant_at_its_limit_is_skipped_without_blocking_others(
    store: RunStore,
) -> None:
    await store.upsert_pool(Pool("default"))
    await store.set_tenant_limit("default", "capped", 2)
    await store.enqueue_many("default", [NewRun("capped", {}) for _ in range(500)])
    await store.enqueue_many("default", [NewRun("other", {}) for _ in range(20)])
    leases = await store.claim("default", "w", 50)
    tenants = [lease.run.tenant_id for lease in leases]
    assert tenants.count("capped") == 2
    assert tenants.count("other") == 20
    # Further claims go nowhere for the capped tenant until one finishes...
    assert await store.claim("default", "w", 10) == []
    await store.ack(next(lease for lease in leases if lease.run.tenant_id == "capped"))
    # ...then exactly one more fits.
    assert [lease.run.tenant_id for lease in await store.claim("default", "w", 10)] == ["capped"]


async def test_pool_default_limit_and_a_zero_override_pause(store: RunStore) -> None:
    await store.upsert_pool(Pool("default", default_max_in_flight=1))
    await store.set_tenant_limit("default", "paused", 0)
    await store.set_tenant_limit("default", "vip", 3)
    for tenant in ("paused", "vip", "anyone", "someone"):
        await store.enqueue_many("default", [NewRun(tenant, {}) for _ in range(5)])
    leases = await store.claim("default", "w", 50)
    counts = {t: [lease.run.tenant_id for lease in leases].count(t)
              for t in ("paused", "vip", "anyone", "someone")}
    assert counts == {"paused": 0, "vip": 3, "anyone": 1, "someone": 1}
    # Removing the override makes the pool default apply again.
    await store.set_tenant_limit("default", "paused", None)
    assert [lease.run.tenant_id for lease in await store.claim("default", "w", 50)] == ["paused"]
    assert await store.tenant_limits("default") == {"vip": 3}
