"""Concurrency keys (issue 27, ARCHITECTURE invariant 5 generalised): with
limit L for a key in a pool, never more than L runs of one (tenant, key) are
leased at once, across all workers; a tenant's hot key does not starve its
other keys; hostile limits and keys are refused."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import psycopg
import pytest

from runlease.db.connect import make_conn_pool
from runlease.db.keys import KeyLimits
from runlease.db.models import Lease
from runlease.db.store import NewRun, Registration, RunStore
from runlease.errors import ValidationError
from tests.integration.test_concurrency import run_threads


async def submit(store: RunStore, tenant: str, key: str, **input_: object) -> None:
    async with store.connection() as conn, conn.transaction():
        (result,) = await store.enqueue_many("default", [NewRun(tenant, dict(input_))],
                                             conn=conn)
        await store.join_key(result.run.id, key, conn=conn)


async def claim_all(store: RunStore, worker: str = "w") -> list[Lease]:
    leases: list[Lease] = []
    for _ in range(3):
        leases += await store.claim("default", worker, 50)
    return leases


async def by_key(store: RunStore, leases: list[Lease]) -> Counter[str | None]:
    return Counter([(await store.get(le.run.id)).concurrency_key for le in leases])


async def test_a_key_at_its_limit_waits_and_its_next_run_goes_when_one_ends(
    store: RunStore,
) -> None:
    await store.replace_key_limits("default", KeyLimits(default=2, keys={"repo-a": 1}))
    for _ in range(5):
        await submit(store, "t", "user-1")
        await submit(store, "t", "repo-a")
    await store.enqueue("default", "t", {})
    leases = await claim_all(store)
    assert await by_key(store, leases) == {"user-1": 2, "repo-a": 1, None: 1}
    assert await store.key_usage("default", "t", "user-1") == (2, 3)
    assert await claim_all(store) == []
    repo = [le for le in leases if (await store.get(le.run.id)).concurrency_key == "repo-a"]
    await store.ack(repo[0])
    assert await by_key(store, await claim_all(store)) == {"repo-a": 1}


async def test_keys_are_a_tenants_own(store: RunStore) -> None:
    await store.replace_key_limits("default", KeyLimits(default=1))
    for tenant in ("a", "b"):
        await submit(store, tenant, "same")
        await submit(store, tenant, "same")
    leases = await claim_all(store)
    assert Counter(le.run.tenant_id for le in leases) == {"a": 1, "b": 1}


async def test_a_hot_key_does_not_starve_the_tenants_other_keys(store: RunStore) -> None:
    await store.replace_key_limits("default", KeyLimits(default=1))
    for i in range(200):
        await submit(store, "t", "hot", i=i)
    await submit(store, "t", "cold")
    assert await by_key(store, await claim_all(store)) == {"hot": 1, "cold": 1}


async def test_raising_a_limit_hands_out_the_slots_now(store: RunStore) -> None:
    await store.replace_key_limits("default", KeyLimits(default=1))
    for _ in range(4):
        await submit(store, "t", "k")
    assert await by_key(store, await claim_all(store)) == {"k": 1}
    assert await store.replace_key_limits("default", KeyLimits(default=3)) == 2
    assert await by_key(store, await claim_all(store, "w2")) == {"k": 2}
    assert await store.replace_key_limits("default", KeyLimits()) == 1  # unlimited
    assert await by_key(store, await claim_all(store, "w3")) == {"k": 1}


async def test_a_failed_or_cancelled_run_frees_its_slot(store: RunStore) -> None:
    await store.replace_key_limits("default", KeyLimits(default=1))
    for _ in range(3):
        await submit(store, "t", "k")
    (first,) = await claim_all(store)
    await store.fail(first, "broken", "no")
    (second,) = await claim_all(store)
    await store.request_cancel(second.run.id)
    await store.finalize_cancel(second)
    (third,) = await claim_all(store)
    assert len({first.run.id, second.run.id, third.run.id}) == 3
    assert await store.key_usage("default", "t", "k") == (1, 0)
    await store.ack(third)
    assert await store.key_usage("default", "t", "k") == (0, 0)
    await store.redrive(first.run.id)  # takes a slot again
    assert await store.key_usage("default", "t", "k") == (1, 0)


@pytest.mark.parametrize("limits", [
    KeyLimits(default=0), KeyLimits(default=-1), KeyLimits(default=10**9),
    KeyLimits(keys={"k": 0}), KeyLimits(keys={"a b": 1}), KeyLimits(keys={"x" * 129: 1}),
    KeyLimits(keys={"*": 1}), KeyLimits(default=True),  # type: ignore[arg-type]
])
async def test_hostile_limits_are_refused(store: RunStore, limits: KeyLimits) -> None:
    with pytest.raises(ValidationError):
        await store.replace_key_limits("default", limits)
    assert await store.key_limits("default") == KeyLimits()


@pytest.mark.parametrize("key", ["", "x" * 129, "a/b", "*", "-k", "a\x00b", 5])
async def test_hostile_keys_are_refused(store: RunStore, key: object) -> None:
    async with store.connection() as conn, conn.transaction():
        (result,) = await store.enqueue_many("default", [NewRun("t", {})], conn=conn)
        with pytest.raises(ValidationError):
            await store.join_key(result.run.id, key, conn=conn)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_key_limit_holds_under_eight_claimers(db_url: str) -> None:
    """8 claimers on their own connections; a sampler never sees more than
    L leased runs of a key, and reaches L."""
    limits = {"one": 1, "three": 3}
    per_key = 60
    keys = ["one", "three", "free"]

    async def setup() -> None:
        async with make_conn_pool(db_url, max_size=1) as conn_pool:
            store = RunStore(conn_pool)
            await store.replace_key_limits("default", KeyLimits(keys=limits))
            for i in range(per_key):
                for key in keys:
                    await submit(store, "t", key, i=i)

    asyncio.run(setup())
    stop = threading.Event()
    observed: Counter[str] = Counter()
    samples = 0

    def sampler() -> None:
        nonlocal samples
        with psycopg.connect(db_url, autocommit=True) as conn:
            while not stop.is_set():
                for key, n in conn.execute(
                        "SELECT concurrency_key, count(*) FROM agent_runs"
                        " WHERE status = 'leased' GROUP BY 1").fetchall():
                    observed[key] = max(observed[key], n)
                samples += 1

    async def claimer(i: int) -> None:
        async with make_conn_pool(db_url, max_size=1) as conn_pool:
            store = RunStore(conn_pool)
            await store.register_worker(Registration(f"w{i}", "default", 0), lease_s=600)
            idle_since = time.monotonic()
            while time.monotonic() - idle_since < 1.5:
                leases = await store.claim("default", f"w{i}", 4)
                if not leases:
                    await asyncio.sleep(0.003)
                    continue
                idle_since = time.monotonic()
                await asyncio.sleep(0.003)
                for n, le in enumerate(leases):
                    if n % 5 == 4:
                        await store.fail(le, "broken", "fatal")
                    else:
                        await store.ack(le)

    sampling = threading.Thread(target=sampler)
    sampling.start()
    try:
        run_threads(8, claimer)
    finally:
        stop.set()
        sampling.join()
    assert samples > 50
    assert observed["one"] == 1
    assert observed["three"] == 3  # reached, never passed
    assert observed["free"] > 3
    with psycopg.connect(db_url) as conn:
        left = conn.execute("SELECT count(*) FROM agent_runs WHERE finished_at IS NULL"
                            ).fetchone()
        active = conn.execute("SELECT key, active, waiting FROM agent_run_keys ORDER BY 1"
                              ).fetchall()
    assert left == (0,)
    # Slots and the counted waiting runs (the gauge's) both back to 0 after the churn.
    assert active == [(k, 0, 0) for k in sorted(keys)]
