"""store.startable_runs: the demand the operator scales on is the work a
claim could start now, counted the way the claim function decides."""

from __future__ import annotations

from runlease.clock import ManualClock
from runlease.db.models import Pool, TenantLimit
from runlease.db.store import NewRun, RunStore

POOL = "agents"


async def claim_all(store: RunStore, worker: str = "w") -> int:
    """Claim until nothing more can be claimed; the number of leases taken."""
    taken = 0
    while leases := await store.claim(POOL, worker, 50):
        taken += len(leases)
    return taken


async def test_capped_tenants_count_up_to_their_cap(store: RunStore) -> None:
    await store.put_pool(Pool(POOL, default_max_in_flight=3),
                         {"capped": TenantLimit(2), "stopped": TenantLimit(0)})
    await store.enqueue_many(POOL, [NewRun("capped", {}) for _ in range(1000)]
                             + [NewRun("plain", {}) for _ in range(10)]
                             + [NewRun("stopped", {}) for _ in range(5)])
    # capped 2 (of 1,000), plain 3 (the pool's default), stopped 0.
    assert await store.startable_runs(POOL) == 5
    assert len(await store.claim(POOL, "w", 1)) == 1
    # What a tenant holds comes off its cap.
    assert await store.startable_runs(POOL) == 4
    # And the count is what the claim function then takes.
    assert await claim_all(store) == 4
    assert await store.startable_runs(POOL) == 0


async def test_backoff_counts_when_due_and_cancelled_runs_never(
    store: RunStore, clock: ManualClock
) -> None:
    await store.put_pool(Pool(POOL), {})
    await store.enqueue_many(POOL, [NewRun("t", {"i": i}) for i in range(3)])
    leases = await store.claim(POOL, "w", 2)
    for lease in leases:
        await store.nack(lease, "flaky", "try later", retry_after_s=60)
    nacked = {lease.run.id for lease in leases}
    (waiting,) = [r for r in await store.list_runs(status="pending", pool=POOL)
                  if r.id not in nacked]
    await store.request_cancel(waiting.id)
    # Two in backoff (not due), one being cancelled: nothing a claim would take.
    assert await store.startable_runs(POOL) == 0
    clock.advance(61)
    assert await store.startable_runs(POOL) == 2
    # A worker of its own: "w" was never renewed, its incarnation is over.
    assert await claim_all(store, "w-later") == 2


async def test_a_paused_pool_has_nothing_to_start(store: RunStore) -> None:
    await store.put_pool(Pool(POOL, paused=True), {})
    await store.enqueue_many(POOL, [NewRun("t", {}) for _ in range(7)])
    assert await store.startable_runs(POOL) == 0
    assert await store.startable_runs("no-such-pool") == 0
    await store.put_pool(Pool(POOL), {})
    assert await store.startable_runs(POOL) == 7
