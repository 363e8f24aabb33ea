"""Every limit setting means one thing: one test per row of docs/limits.md,
and no combination leaves a tenant with claimable runs waiting forever."""

from __future__ import annotations

import itertools

import pytest

from runlease.db.models import Lease, Pool
from runlease.db.store import NewRun, RunStore

UNSET = None


async def leased_now(store: RunStore, tenant: str, claims: int = 3) -> list[Lease]:
    """Claim (several times, as workers would) and return the tenant's leases."""
    leases: list[Lease] = []
    for _ in range(claims):
        leases += await store.claim("default", "w", 50)
    return [lease for lease in leases if lease.run.tenant_id == tenant]


# (pool default_max_in_flight, tenant max_in_flight, runs of the tenant leased at once)
LIMIT_ROWS = [
    pytest.param(UNSET, UNSET, 8, id="default unset, tenant unset: not limited"),
    pytest.param(0, UNSET, 0, id="default 0, tenant unset: paused"),
    pytest.param(2, UNSET, 2, id="default N, tenant unset: N"),
    pytest.param(UNSET, 0, 0, id="tenant 0: paused whatever the default"),
    pytest.param(5, 0, 0, id="tenant 0 beside a default N: paused"),
    pytest.param(UNSET, 3, 3, id="tenant N, default unset: N"),
    pytest.param(1, 3, 3, id="tenant N over a default: N"),
    pytest.param(0, 3, 3, id="tenant N beside a default 0: N"),
]


@pytest.mark.parametrize(("default", "limit", "leased"), LIMIT_ROWS)
async def test_each_limit_setting_means_one_thing(
    store: RunStore, default: int | None, limit: int | None, leased: int
) -> None:
    await store.upsert_pool(Pool("default", default_max_in_flight=default))
    if limit is not None:
        await store.set_tenant_limit("default", "t", limit)
    # Many other tenants, first in the fair order, with the same settings as
    # the default: a default-paused crowd must not hide a tenant with room.
    await store.enqueue_many("default", [NewRun(f"crowd-{i}", {}) for i in range(60)])
    await store.enqueue_many("default", [NewRun("t", {}) for _ in range(8)])
    assert len(await leased_now(store, "t")) == leased
    # Submits are accepted whatever the limit.
    assert (await store.enqueue("default", "t", {})).inserted


async def test_unsetting_a_tenants_limit_gives_it_the_default_again(store: RunStore) -> None:
    await store.upsert_pool(Pool("default", default_max_in_flight=2))
    await store.set_tenant_limit("default", "t", 0)
    await store.enqueue_many("default", [NewRun("t", {}) for _ in range(5)])
    assert await leased_now(store, "t") == []
    await store.set_tenant_limit("default", "t", UNSET)
    assert len(await leased_now(store, "t")) == 2


async def test_a_paused_pool_claims_nothing_until_resumed(store: RunStore) -> None:
    await store.upsert_pool(Pool("default", paused=True))
    await store.enqueue_many("default", [NewRun("t", {}) for _ in range(3)])
    assert await leased_now(store, "t") == []
    await store.upsert_pool(Pool("default", paused=False))
    assert len(await leased_now(store, "t")) == 3


async def test_a_tenant_at_its_cap_waits_and_the_next_run_goes_when_one_ends(
    store: RunStore,
) -> None:
    await store.set_tenant_limit("default", "t", 2)
    await store.enqueue_many("default", [NewRun("t", {}) for _ in range(4)]
                             + [NewRun("other", {}) for _ in range(4)])
    leases = await store.claim("default", "w", 50)
    mine = [lease for lease in leases if lease.run.tenant_id == "t"]
    assert (len(mine), len(leases) - len(mine)) == (2, 4)  # others are not held up
    assert await store.claim("default", "w", 50) == []
    await store.ack(mine[0])
    assert [lease.run.tenant_id for lease in await store.claim("default", "w", 50)] == ["t"]


async def test_a_limit_lowered_below_what_is_leased_recovers_when_runs_end(
    store: RunStore,
) -> None:
    await store.set_tenant_limit("default", "t", 3)
    await store.enqueue_many("default", [NewRun("t", {}) for _ in range(5)])
    held = await store.claim("default", "w", 50)
    assert len(held) == 3
    # Lowered to 1 with 3 leased: leases are not taken back, no claim until
    # fewer than 1 remain, then exactly one at a time.
    await store.set_tenant_limit("default", "t", 1)
    for lease in held:
        assert await store.claim("default", "w", 50) == []
        await store.ack(lease)
    (next_one,) = await store.claim("default", "w", 50)
    assert await store.claim("default", "w", 50) == []
    await store.ack(next_one)
    assert len(await store.claim("default", "w", 50)) == 1


COMBINATIONS = list(itertools.product([UNSET, 0, 1, 3], [UNSET, 0, 1, 2], [False, True]))


@pytest.mark.parametrize(("default", "limit", "lowered"), COMBINATIONS,
                         ids=[f"default={d}-tenant={t}-lowered={lo}"
                              for d, t, lo in COMBINATIONS])
async def test_no_combination_leaves_claimable_runs_waiting_forever(
    store: RunStore, default: int | None, limit: int | None, lowered: bool
) -> None:
    await store.upsert_pool(Pool("default", default_max_in_flight=default))
    if lowered:  # runs leased under a higher limit, then the limit lowered
        await store.set_tenant_limit("default", "t", 5)
        await store.enqueue_many("default", [NewRun("t", {}) for _ in range(5)])
        held = await store.claim("default", "w", 50)
    else:
        held = []
    if limit is not None or lowered:
        await store.set_tenant_limit("default", "t", limit)
    await store.enqueue_many("default", [NewRun(f"crowd-{i % 15}", {}) for i in range(45)]
                             + [NewRun("t", {}) for _ in range(6)])
    effective = {"t": limit if limit is not None else default, "crowd": default}
    # Workers of batch 4 claim and finish everything they can.
    for _ in range(200):
        leases = await store.claim("default", "w", 4)
        if held:
            leases.append(held.pop())
        if not leases:
            break
        await store.ack_many([(lease, None) for lease in leases])
    else:
        raise AssertionError("claims did not settle")
    stats = await store.queue_stats("default")
    for tenant, (pending, _, leased) in stats.by_tenant.items():
        cap = effective["t" if tenant == "t" else "crowd"]
        assert leased == 0
        # Whoever may run has nothing left waiting; a paused tenant keeps all.
        assert (pending == 0) == (cap != 0), (tenant, cap, pending)
