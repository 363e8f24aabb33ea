"""Queue counts kept by triggers and folded by the reaper's leader stay
exact: after every kind of transition, and with several connections
writing at once, queue_stats, the dead counts and startable_runs equal what
count(*) over agent_runs says."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime
from typing import Any

import psycopg

from runlease.clock import ManualClock
from runlease.db.connect import make_conn_pool
from runlease.db.models import Pool
from runlease.db.store import NewRun, RunStore
from runlease.errors import LeaseLost, RunleaseError


def truth(db_url: str, pool: str, now: datetime | None) -> dict[str, Any]:
    """What count(*) says: per tenant (pending, ready, leased), dead by code."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT tenant_id, count(*) FILTER (WHERE status = 'pending'),"
            "       count(*) FILTER (WHERE status = 'pending'"
            "                          AND available_at <= coalesce(%s, now())),"
            "       count(*) FILTER (WHERE status = 'leased')"
            "  FROM agent_runs WHERE pool = %s AND status IN ('pending', 'leased')"
            " GROUP BY tenant_id", (now, pool)).fetchall()
        dead = conn.execute("SELECT error_code, count(*) FROM agent_runs"
                            " WHERE pool = %s AND status = 'dead' GROUP BY 1",
                            (pool,)).fetchall()
    return {"by_tenant": {r[0]: (r[1], r[2], r[3]) for r in rows},
            "dead": {r[0]: r[1] for r in dead}}


async def counted(store: RunStore, pool: str) -> dict[str, Any]:
    stats = await store.queue_stats(pool)
    return {"by_tenant": {t: v for t, v in stats.by_tenant.items() if any(v)},
            "dead": stats.dead_by_code}


def statuses(db_url: str, pool: str) -> dict[str, int]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT status, count(*) FROM agent_runs WHERE pool = %s"
                            " GROUP BY 1", (pool,)).fetchall()
    return {r[0]: r[1] for r in rows}


async def check(store: RunStore, db_url: str, now: datetime | None, pool: str = "default"
                ) -> None:
    assert await counted(store, pool) == truth(db_url, pool, now)
    # Every status, done and cancelled too (the console's counts).
    assert (await store.status_counts(pool=pool)).by_status == statuses(db_url, pool)


async def test_counts_follow_every_transition(store: RunStore, clock: ManualClock,
                                              db_url: str) -> None:
    async def step() -> None:
        await check(store, db_url, clock.db_now())
        await store.fold_counts()
        await check(store, db_url, clock.db_now())

    await store.enqueue_many("default", [NewRun(f"t{i % 3}", {}) for i in range(30)])
    await store.enqueue("default", "t0", {}, max_attempts=1)
    await step()
    leases = await store.claim("default", "w", 12)
    await step()
    await store.ack(leases[0])
    await store.ack_many([(x, None) for x in leases[1:3]])
    await store.nack(leases[3], "flaky", "x")  # into backoff
    await store.fail(leases[4], "broken", "x")  # dead
    await store.release("w", [(leases[5].run_id, leases[5].epoch)])
    await store.request_cancel(leases[6].run_id)
    await store.finalize_cancel(leases[6])
    await step()
    pending = await store.list_runs(status="pending", limit=2)
    await store.request_cancel(pending[0].id)  # pending -> cancelled
    await step()
    clock.advance(6)  # the backoff is over: ready before any claim promotes it
    await step()
    clock.advance(3600)  # every lease expired: reaped
    reaped = await store.reap()
    assert reaped.to_pending + reaped.to_dead + reaped.to_cancelled == 5
    await step()
    dead = [r for r in await store.list_runs(status="dead") if r.error_code == "broken"]
    await store.redrive(dead[0].id)
    await step()
    await store.upsert_pool(Pool("default", retention_s=60))
    clock.advance(120)
    await store.delete_expired()
    await step()
    # Everything claimed and done: the totals come back to zero rows (by a
    # worker of its own: "w"'s incarnation expired an hour ago).
    while leases := await store.claim("default", "w-last", 50):
        await store.ack_many([(x, None) for x in leases])
    await store.fold_counts()
    await check(store, db_url, clock.db_now())
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM agent_run_counts"
                            " WHERE state IN ('pending', 'delayed')").fetchone() == (0,)


async def test_a_claim_appends_one_delta_per_tenant(store: RunStore, db_url: str) -> None:
    # The claim counts its own runs (the count trigger passes claims over):
    # one delta row per (pool, tenant) of the runs it leased, not one per run.
    await store.enqueue_many("default", [NewRun(f"t{i % 2}", {}) for i in range(60)])
    await store.fold_counts()
    leases = await store.claim("default", "w", 50)
    assert len(leases) == 50
    with psycopg.connect(db_url) as conn:
        deltas = conn.execute("SELECT tenant_id, state, n FROM agent_run_count_deltas"
                              " ORDER BY 1").fetchall()
    assert deltas == [("t0", "pending", -25), ("t1", "pending", -25)]
    await check(store, db_url, None)
    await store.fold_counts()
    await check(store, db_url, None)


async def test_startable_runs_come_from_the_counts(store: RunStore, clock: ManualClock) -> None:
    await store.upsert_pool(Pool("default", default_max_in_flight=2))
    await store.enqueue_many("default", [NewRun("capped", {}) for _ in range(50)]
                             + [NewRun("other", {}) for _ in range(3)])
    await store.fold_counts()
    assert await store.startable_runs("default") == 4
    leases = await store.claim("default", "w", 4)
    assert await store.startable_runs("default") == 0  # both tenants at their cap
    first, second = [x for x in leases if x.run.tenant_id == "other"]
    await store.nack(first, "flaky", "x")
    await store.ack(second)
    assert await store.startable_runs("default") == 1  # the nacked run waits
    clock.advance(10)
    assert await store.startable_runs("default") == 2  # due, not promoted by a claim yet


async def test_counts_stay_exact_with_concurrent_writers(db_url: str) -> None:
    rng = random.Random(16)
    async with make_conn_pool(db_url, min_size=6, max_size=6) as conn_pool:
        store = RunStore(conn_pool)
        stop = asyncio.Event()

        async def writer(k: int) -> None:
            while not stop.is_set():
                try:
                    choice = rng.random()
                    if choice < 0.3:
                        await store.enqueue_many("default", [
                            NewRun(f"t{rng.randrange(4)}", {}, max_attempts=2)
                            for _ in range(rng.randrange(1, 20))])
                    else:
                        leases = await store.claim("default", f"w{k}", rng.randrange(1, 8))
                        for lease in leases:
                            r = rng.random()
                            if r < 0.5:
                                await store.ack(lease)
                            elif r < 0.7:
                                await store.nack(lease, "flaky", "x", retry_after_s=0)
                            elif r < 0.8:
                                await store.fail(lease, rng.choice(["a", "b"]), "x")
                            elif r < 0.9:
                                await store.release(f"w{k}", [(lease.run_id, lease.epoch)])
                            else:
                                await store.request_cancel(lease.run_id)
                                await store.finalize_cancel(lease)
                except (LeaseLost, RunleaseError):
                    pass

        async def folder() -> None:
            while not stop.is_set():
                await store.fold_counts()
                await asyncio.sleep(0.01)

        tasks = [asyncio.create_task(writer(k)) for k in range(4)]
        tasks.append(asyncio.create_task(folder()))
        await asyncio.sleep(4)
        stop.set()
        await asyncio.gather(*tasks)
        # Now nothing writes: the counts, folded or not, are exact.
        await check(store, db_url, None)
        await store.fold_counts()
        await check(store, db_url, None)
        with psycopg.connect(db_url) as conn:
            n = conn.execute("SELECT count(*) FROM agent_runs").fetchone()
        assert n is not None
        assert n[0] > 100


async def test_a_large_fold_gives_the_emptied_pages_back(live_store: RunStore,
                                                         db_url: str) -> None:
    store = live_store
    # The fold's own VACUUM is what is tested: autovacuum, woken by this much
    # churn, would hold the table's lock and make it skip (SKIP_LOCKED), or
    # keep the truncation from its lock (seen once in CI: 115 pages left).
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE agent_run_count_deltas SET (autovacuum_enabled = false)")
    pages: list[int] = []
    for _ in range(6):  # past the prepared-statement threshold as well
        # A tenant per run: a claim appends a delta per tenant of its runs.
        await store.enqueue_many("default", [NewRun(f"t{i}", {}) for i in range(5_200)])
        for _ in range(6):
            await store.claim("default", "w", 1_000)
        assert await store.fold_counts() >= 5_000
        await check(store, db_url, None)
        with psycopg.connect(db_url) as conn:
            row = conn.execute("SELECT pg_relation_size('agent_run_count_deltas') / 8192"
                               ).fetchone()
            assert row is not None
            pages.append(int(row[0]))
    # A VACUUM gives the trailing pages back only if it gets the table's
    # exclusive lock at once; on a loaded server one round in six may keep
    # its pages (seen in CI: 116 left, a round's deltas) or skip the table
    # (SKIP_LOCKED: two rounds' worth until the next). Without the fold's
    # VACUUM no round ends empty and the pages pile up round after round.
    assert pages.count(0) >= 5, pages
    assert max(pages) < 350, pages
