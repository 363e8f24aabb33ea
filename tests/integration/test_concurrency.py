"""Concurrent claimers on separate connections, in separate threads.

Each thread runs its own event loop and its own connection, so the claims
really race inside PostgreSQL.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any
from uuid import UUID

import psycopg
import pytest

from runlease.db.connect import make_conn_pool
from runlease.db.models import Pool
from runlease.db.store import NewRun, Registration, RunStore

pytestmark = pytest.mark.slow


def run_threads(n: int, target: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            asyncio.run(target(i))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), name=f"claimer-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a claimer thread hung"
    if errors:
        raise errors[0]


async def enqueue(db_url: str, pool: str, runs: list[NewRun]) -> None:
    async with make_conn_pool(db_url, max_size=1) as conn_pool:
        store = RunStore(conn_pool)
        for i in range(0, len(runs), 2000):
            await store.enqueue_many(pool, runs[i:i + 2000])


def test_eight_claimers_claim_ten_thousand_runs_exactly_once(db_url: str) -> None:
    total = 10_000
    asyncio.run(enqueue(db_url, "default", [NewRun(f"t{i % 7}", {"i": i}) for i in range(total)]))
    claimed: list[list[tuple[UUID, int]]] = [[] for _ in range(8)]

    async def claimer(i: int) -> None:
        rng = random.Random(i)
        async with make_conn_pool(db_url, max_size=1, application_name=f"claimer-{i}") as conn_pool:
            store = RunStore(conn_pool)
            await store.register_worker(Registration(f"w{i}", "default", 0), lease_s=600)
            async with conn_pool.connection() as conn:
                while True:
                    leases = await store.claim("default", f"w{i}", rng.choice((1, 5, 20)),
                                               conn=conn)
                    if not leases:
                        return
                    claimed[i] += [(lease.run_id, lease.epoch) for lease in leases]
                    lost = await store.ack_many([(lease, None) for lease in leases], conn=conn)
                    assert not lost

    run_threads(8, claimer)
    ids = [run_id for per_thread in claimed for run_id, _ in per_thread]
    assert len(ids) == total
    assert len(set(ids)) == total  # nobody claimed a run another had claimed
    assert {epoch for per_thread in claimed for _, epoch in per_thread} == {1}
    assert sum(1 for c in claimed if c) == 8  # all eight really took part
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT status, attempts, lease_epoch, count(*) FROM agent_runs GROUP BY 1, 2, 3"
        ).fetchall()
    assert rows == [("done", 1, 1, total)]


def test_tenant_limits_hold_under_contention(db_url: str) -> None:
    limits = {"one": 1, "three": 3}
    per_tenant = 150
    tenants = ["one", "three", "free"]

    async def setup() -> None:
        async with make_conn_pool(db_url, max_size=1) as conn_pool:
            store = RunStore(conn_pool)
            await store.upsert_pool(Pool("limited"))
            await store.replace_tenant_limits("limited", limits)

    asyncio.run(setup())
    asyncio.run(enqueue(db_url, "limited",
                        [NewRun(t, {"i": i}) for i in range(per_tenant) for t in tenants]))

    stop = threading.Event()
    observed: Counter[str] = Counter()
    samples = 0

    def sampler() -> None:
        nonlocal samples
        with psycopg.connect(db_url, autocommit=True) as conn:
            while not stop.is_set():
                rows = conn.execute(
                    "SELECT tenant_id, count(*) FROM agent_runs"
                    " WHERE pool = 'limited' AND status = 'leased' GROUP BY tenant_id"
                ).fetchall()
                for tenant, n in rows:
                    observed[tenant] = max(observed[tenant], n)
                samples += 1

    sampling = threading.Thread(target=sampler)
    sampling.start()

    async def claimer(i: int) -> None:
        async with make_conn_pool(db_url, max_size=1) as conn_pool:
            store = RunStore(conn_pool)
            await store.register_worker(Registration(f"w{i}", "limited", 0), lease_s=600)
            async with conn_pool.connection() as conn:
                idle_since = time.monotonic()
                while time.monotonic() - idle_since < 1.0:
                    leases = await store.claim("limited", f"w{i}", 4, conn=conn)
                    if not leases:
                        await asyncio.sleep(0.002)
                        continue
                    idle_since = time.monotonic()
                    await asyncio.sleep(0.003)  # hold the leases a moment
                    assert not await store.ack_many([(lease, None) for lease in leases],
                                                    conn=conn)

    try:
        run_threads(8, claimer)
    finally:
        stop.set()
        sampling.join()

    assert samples > 100
    assert observed["one"] == 1
    assert observed["three"] == 3  # reached, never passed
    assert observed["free"] > 3    # the unlimited tenant was not held back
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT tenant_id, status, count(*) FROM agent_runs GROUP BY 1, 2 ORDER BY 1"
        ).fetchall()
    assert rows == [(t, "done", per_tenant) for t in sorted(tenants)]
