"""Invariants 11 and 5 (per key) with workers killed by kill -9 (issue
27's tests): 8 claimer processes, each its own worker incarnation, claim and
ack the runs of 6 threads and of 2 keys limited to 2 while the test kills
one with SIGKILL every ~0.4 s (a new one takes its place) and reaps the dead
ones' leases. A sampler never sees two leased runs of one thread nor three
of one key, and each run of a thread starts only after the one before it
finished (submit order), though runs were reclaimed after a kill."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import threading
import time

import psycopg
import pytest

from runlease.db.connect import make_conn_pool
from runlease.db.keys import KeyLimits
from runlease.db.store import NewRun, RunStore
from tests.support.thread_claimer import claim_until

THREADS = [(f"t{i % 2}", f"conv-{i}") for i in range(6)]
PER_THREAD = 15
KEYS = [("t0", "k-a"), ("t1", "k-b")]  # a limit of 2 each, by the pattern k-*
PER_KEY = 20
CLAIMERS = 8
KILLS = 15
MAX_ATTEMPTS = KILLS + 1  # a run every kill lands on is still not dead


def _sample(db_url: str, stop: threading.Event, seen: dict[str, int]) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        while not stop.is_set():
            (n,) = conn.execute(
                "SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM agent_runs"
                " WHERE status = 'leased' AND thread_id IS NOT NULL"
                " GROUP BY tenant_id, thread_id) x").fetchone() or (0,)
            seen["worst"] = max(seen["worst"], n)
            (k,) = conn.execute(
                "SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM agent_runs"
                " WHERE status = 'leased' AND concurrency_key IS NOT NULL"
                " GROUP BY tenant_id, concurrency_key) x").fetchone() or (0,)
            seen["worst_key"] = max(seen["worst_key"], k)
            seen["samples"] += 1


async def _submit_all(db_url: str) -> None:
    async with make_conn_pool(db_url, max_size=1) as conn_pool:
        store = RunStore(conn_pool)
        await store.replace_key_limits("default", KeyLimits(keys={"k-*": 2}))
        for k in range(PER_THREAD):
            for tenant, thread in THREADS:
                run = NewRun(tenant, {"k": k}, max_attempts=MAX_ATTEMPTS)
                async with store.connection() as conn, conn.transaction():
                    await store.submit_to_thread("default", run, thread, conn=conn)
        for k in range(PER_KEY):
            for tenant, key in KEYS:
                run = NewRun(tenant, {"k": k}, max_attempts=MAX_ATTEMPTS)
                async with store.connection() as conn, conn.transaction():
                    (made,) = await store.enqueue_many("default", [run], conn=conn)
                    await store.join_key(made.run.id, key, conn=conn)


async def _reap_until_done(db_url: str, procs: dict[str, multiprocessing.process.BaseProcess],
                           spawn: multiprocessing.context.SpawnContext) -> int:
    """Every ~0.4 s kill -9 a claimer that holds leases (one whose process
    is still starting holds none) and start another; reap; until every run
    finished (or 150 s). Returns the kills."""
    rng = random.Random(27)
    kills = 0
    n = len(procs)
    async with make_conn_pool(db_url, max_size=1) as conn_pool:
        store = RunStore(conn_pool)
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            await asyncio.sleep(0.4)
            await store.reap()
            async with store.connection() as conn:
                row = await (await conn.execute(
                    "SELECT count(*) AS n FROM agent_runs WHERE finished_at IS NULL")).fetchone()
                holders = [r["locked_by"] for r in await (await conn.execute(
                    "SELECT DISTINCT locked_by FROM agent_runs WHERE status = 'leased'"
                    " ORDER BY 1")).fetchall()]
            if row is not None and row["n"] == 0:
                break
            alive = [h for h in holders if h in procs and procs[h].is_alive()]
            if not alive or kills >= KILLS:
                continue
            victim = rng.choice(alive)
            procs[victim].kill()  # SIGKILL: no release, no deregistration
            procs[victim].join()
            kills += 1
            name = f"c{n}"
            n += 1
            procs[name] = spawn.Process(target=claim_until, args=(db_url, name, 150.0))
            procs[name].start()
    return kills


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_thread_and_key_rules_hold_through_kill_9_of_workers(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE test_out_of_order (run_id uuid)")
    asyncio.run(_submit_all(db_url))
    spawn = multiprocessing.get_context("spawn")
    procs: dict[str, multiprocessing.process.BaseProcess] = {
        f"c{i}": spawn.Process(target=claim_until, args=(db_url, f"c{i}", 150.0))
        for i in range(CLAIMERS)}
    stop = threading.Event()
    seen = {"worst": 0, "worst_key": 0, "samples": 0}
    sampler = threading.Thread(target=_sample, args=(db_url, stop, seen))
    sampler.start()
    for p in procs.values():
        p.start()
    try:
        kills = asyncio.run(_reap_until_done(db_url, procs, spawn))
    finally:
        stop.set()
        sampler.join()
        for p in procs.values():
            if p.is_alive():
                p.kill()
            p.join()
    assert kills >= 5
    assert seen["samples"] > 50
    assert seen["worst"] == 1  # reached, never passed
    assert seen["worst_key"] == 2  # a key's limit across worker processes, reached, never passed
    with psycopg.connect(db_url) as conn:
        statuses: dict[str, int] = dict(conn.execute(
            "SELECT status, count(*) FROM agent_runs GROUP BY 1").fetchall())
        reclaimed = conn.execute(
            "SELECT count(*) FROM agent_runs WHERE jsonb_array_length(holders) > 1"
        ).fetchone()
        # Claimed while an earlier run of its thread was unfinished (the
        # claimers check each claim once it committed).
        early = conn.execute("SELECT count(*) FROM test_out_of_order").fetchone()
    assert statuses == {"done": PER_THREAD * len(THREADS) + PER_KEY * len(KEYS)}, statuses
    assert reclaimed is not None
    assert reclaimed[0] > 0  # kill -9 left leases that were reaped and claimed again
    assert early == (0,)
