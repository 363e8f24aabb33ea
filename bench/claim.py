"""Claim + ack throughput: runlease's store against the raw-SQL floor.

    python bench/claim.py [--database-url URL] [--jobs 20000] [--json]

For K = 1, 2, 4 concurrent claimers (one process and one connection each),
at batch 1 and batch 50, each claimer loops claim -> ack until the queue is
empty:

- raw:     the seed design note's claim and ack statements issued directly
           with psycopg on the seed's table and indexes, no library code;
- raw async: the same through psycopg's asyncio API, the driver the store uses;
- schema:  the raw statements again, on runlease's agent_runs (the seed's
           claim in fair order by agent_runs_claim_idx, with the fencing
           epoch; the ack as the seed's): what runlease's table costs (its
           width, partial indexes, CHECKs and triggers) before any of the
           claim's logic and any library code;
- store:   runlease's RunStore (claim() and ack_many()), tenant limits off;
- limits:  the same with a per-tenant limit configured on the pool (high
           enough never to bind), so the limit path runs: tenant locks and
           the in-flight count.

All on one server in one run. Without --database-url a durable embedded
PostgreSQL is started (fsync on, as in production).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import emit_json, fresh_database, incarnation, print_table, server, timed_processes

from runlease.db.connect import make_conn_pool
from runlease.db.models import Pool
from runlease.db.store import NewRun, RunStore

TENANTS = 10

# The seed note's table, indexes and statements (shared/seed), verbatim in
# substance: this is the floor a hand-written queue would reach.
SEED_SCHEMA = """
CREATE TABLE seed_agent_runs (
  id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id         text NOT NULL,
  status            text NOT NULL
                    CHECK (status IN ('pending', 'leased', 'done', 'dead', 'cancelled')),
  priority          int  NOT NULL DEFAULT 0,
  attempts          int  NOT NULL DEFAULT 0,
  max_attempts      int  NOT NULL DEFAULT 3,
  available_at      timestamptz NOT NULL DEFAULT now(),
  locked_until      timestamptz,
  locked_by         text,
  cancel_requested_at timestamptz,
  budget_json       jsonb NOT NULL DEFAULT '{}'::jsonb,
  input_json        jsonb NOT NULL,
  error_code        text,
  error_message     text,
  created_at        timestamptz NOT NULL DEFAULT now(),
  updated_at        timestamptz NOT NULL DEFAULT now(),
  finished_at       timestamptz
);
CREATE INDEX seed_claim_idx ON seed_agent_runs (priority DESC, available_at, created_at)
  WHERE status = 'pending';
CREATE INDEX seed_lease_idx ON seed_agent_runs (locked_until) WHERE status = 'leased';
"""

SEED_CLAIM = """
WITH cte AS (
  SELECT id FROM seed_agent_runs
   WHERE status = 'pending' AND available_at <= now()
   ORDER BY priority DESC, available_at, created_at
   FOR UPDATE SKIP LOCKED
   LIMIT %(n)s
)
UPDATE seed_agent_runs AS r
   SET status = 'leased', locked_by = %(worker)s,
       locked_until = now() + (%(lease_s)s * interval '1 second'),
       attempts = r.attempts + 1, updated_at = now()
  FROM cte
 WHERE r.id = cte.id
RETURNING r.id, r.tenant_id, r.attempts, r.max_attempts, r.budget_json, r.input_json,
          r.cancel_requested_at
"""

SEED_ACK = """
UPDATE seed_agent_runs
   SET status = 'done', locked_by = NULL, locked_until = NULL,
       finished_at = now(), updated_at = now()
 WHERE id = ANY(%(ids)s) AND status = 'leased' AND locked_by = %(worker)s
"""


# The seed's statements on agent_runs: what the schema alone costs. The
# claim reads the pool's fair order (agent_runs_claim_idx: it states the
# index's marker predicate, fair_seq >= 0, as runlease_claim does; without
# it no index gives that order and this measured a sort, not the schema: a
# third of its figure until 2026-12-07) and bumps the
# fencing epoch (the lease itself is the holder's row of agent_run_workers
# since migration 0015: no lease time on the run, as runlease_claim); the ack
# ends the lease as the CHECKs require. The counts'
# trigger passes both over (a claim's delta is runlease_claim's own; an
# ack's leased -> done is not counted), so this database's counts drift:
# it is thrown away.
SCHEMA_CLAIM = """
WITH cte AS (
  SELECT id FROM agent_runs
   WHERE pool = 'bench' AND status = 'pending' AND NOT delayed AND fair_seq >= 0
     AND available_at <= now()
   ORDER BY fair_seq, id
   FOR UPDATE SKIP LOCKED
   LIMIT %(n)s
)
UPDATE agent_runs AS r
   SET status = 'leased', locked_by = %(worker)s,
       attempts = r.attempts + 1, lease_epoch = r.lease_epoch + 1, updated_at = now()
  FROM cte
 WHERE r.id = cte.id
RETURNING r.id, r.tenant_id, r.attempts, r.max_attempts, r.lease_epoch, r.budget_json,
          r.input_json, r.cancel_requested_at
"""
SCHEMA_ACK = """
UPDATE agent_runs
   SET status = 'done', locked_by = NULL,
       finished_at = now(), updated_at = now()
 WHERE id = ANY(%(ids)s) AND status = 'leased' AND locked_by = %(worker)s
"""


def raw_claimer(url: str, worker: str, batch: int, ready: Any, results: Any,
                claim: str = SEED_CLAIM, ack: str = SEED_ACK) -> None:
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        ready.wait()
        while True:
            rows = conn.execute(claim, {"n": batch, "worker": worker, "lease_s": 45},
                                prepare=True).fetchall()
            if not rows:
                break
            conn.execute(ack, {"ids": [r[0] for r in rows], "worker": worker}, prepare=True)
            done += len(rows)
    results.put(done)


def schema_claimer(url: str, worker: str, batch: int, ready: Any, results: Any) -> None:
    raw_claimer(url, worker, batch, ready, results, SCHEMA_CLAIM, SCHEMA_ACK)


def raw_async_claimer(url: str, worker: str, batch: int, ready: Any, results: Any) -> None:
    """The raw floor again, through psycopg's asyncio API (the store's driver)."""
    async def loop() -> int:
        done = 0
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await asyncio.to_thread(ready.wait)
            while True:
                cur = await conn.execute(SEED_CLAIM, {"n": batch, "worker": worker,
                                                      "lease_s": 45}, prepare=True)
                rows = await cur.fetchall()
                if not rows:
                    break
                await conn.execute(SEED_ACK, {"ids": [r[0] for r in rows], "worker": worker},
                                   prepare=True)
                done += len(rows)
        return done

    results.put(asyncio.run(loop()))


def store_claimer(url: str, worker: str, batch: int, ready: Any, results: Any) -> None:
    async def loop() -> int:
        done = 0
        async with make_conn_pool(url, min_size=1, max_size=1) as conn_pool:
            store = RunStore(conn_pool)
            holder = await incarnation(store, worker, "bench")
            async with conn_pool.connection() as conn:
                await asyncio.to_thread(ready.wait)
                while leases := await store.claim("bench", holder, batch, conn=conn):
                    if batch == 1:
                        await store.ack(leases[0], conn=conn)
                    else:
                        lost = await store.ack_many([(lease, None) for lease in leases],
                                                    conn=conn)
                        assert not lost
                    done += len(leases)
        return done

    results.put(asyncio.run(loop()))


def load_seed(url: str, jobs: int, stats: str = "analyzed") -> None:
    """The seed's table with `jobs` pending runs; `stats` as load_store's."""
    if stats not in STATS_STATES:
        raise ValueError(f"stats must be one of {STATS_STATES}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS seed_agent_runs")
        conn.execute(SEED_SCHEMA)
        if stats == "million_done":
            conn.execute(
                "INSERT INTO seed_agent_runs (tenant_id, status, input_json, finished_at)"
                " SELECT 't' || (g %% %s), 'done', '{}', now() - interval '1 hour'"
                "   FROM generate_series(1, %s) g", (TENANTS, MILLION))
        if stats in ("idle_analyzed", "million_done"):
            conn.execute("VACUUM ANALYZE seed_agent_runs")
        conn.execute(
            "INSERT INTO seed_agent_runs (tenant_id, status, input_json)"
            " SELECT 't' || (g %% %s), 'pending', '{}' FROM generate_series(1, %s) g",
            (TENANTS, jobs),
        )
        if stats == "analyzed":
            conn.execute("VACUUM ANALYZE seed_agent_runs")


# What the planner knows when a load arrives (bench/burst.py): "analyzed"
# runs VACUUM ANALYZE after loading (every other bench does); the others are
# the states a production table is in when a burst lands on an idle pool.
STATS_STATES = ("analyzed", "idle_analyzed", "truncated", "million_done")
MILLION = 1_000_000


def load_store(url: str, jobs: int, limits: bool = False, pool: str = "bench",
               stats: str = "analyzed") -> float:
    """Empty the queue, (re)define `pool` (a tenant default cap if `limits`) and
    enqueue `jobs` no-op runs into it in batches of 1000; returns seconds.
    `stats` (STATS_STATES): analyzed after the load, or before it with
    nothing pending (idle_analyzed), never (truncated), or with 1,000,000
    done runs in the table (million_done)."""
    if stats not in STATS_STATES:
        raise ValueError(f"stats must be one of {STATS_STATES}")
    async def go() -> float:
        async with make_conn_pool(url, max_size=1) as conn_pool:
            store = RunStore(conn_pool)
            async with store.connection() as conn:
                await conn.execute("TRUNCATE agent_runs CASCADE")
                if stats == "million_done":
                    await conn.execute(
                        "INSERT INTO agent_runs (id, pool, tenant_id, status, fair_seq,"
                        " input_json, attempts, lease_epoch, finished_at)"
                        " SELECT gen_random_uuid(), %s, 't' || (i %% 50), 'done', i, '{}',"
                        "        1, 1, now() - interval '1 hour'"
                        "   FROM generate_series(1, %s) i", (pool, MILLION))
                if stats in ("idle_analyzed", "million_done"):
                    await conn.execute("VACUUM ANALYZE agent_runs")
            await store.upsert_pool(Pool(pool, default_max_in_flight=10_000 if limits else None))
            t0 = time.perf_counter()
            for start in range(0, jobs, 1000):
                await store.enqueue_many(pool, [
                    NewRun(f"t{i % TENANTS}", {}) for i in range(start, min(jobs, start + 1000))
                ])
            elapsed = time.perf_counter() - t0
            if stats == "analyzed":
                async with store.connection() as conn:
                    # Statistics now, not an autoanalyze in the middle of a drain.
                    await conn.execute("VACUUM ANALYZE agent_runs")
            return elapsed

    return asyncio.run(go())


def measure(url: str, kind: str, k: int, batch: int, jobs: int,
            stats: str = "analyzed", before_claim: Callable[[], None] | None = None) -> float:
    """Jobs/s of k claimers of `kind` draining `jobs` runs loaded under `stats`
    (STATS_STATES: the planner's statistics when the load lands);
    `before_claim` is called once the load is done, before the claimers
    start (bench/ceiling.py reads the CPU counters there)."""
    if kind in ("raw", "raw_async"):
        load_seed(url, jobs, stats)
        target = raw_claimer if kind == "raw" else raw_async_claimer
    elif kind == "schema":
        load_store(url, jobs, stats=stats)
        target = schema_claimer
    else:
        load_store(url, jobs, limits=(kind == "limits"), stats=stats)
        target = store_claimer
    if before_claim is not None:
        before_claim()
    elapsed, counts = timed_processes(target, lambda i: (url, f"bench-{i}", batch), k)
    if sum(counts) != jobs:
        raise SystemExit(f"{kind} K={k} batch={batch}: processed {sum(counts)} of {jobs}")
    return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--claimers", default="1,2,4")
    parser.add_argument("--batches", default="1,50")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ks = [int(k) for k in args.claimers.split(",")]
    batches = [int(b) for b in args.batches.split(",")]

    figures: dict[str, Any] = {"jobs": args.jobs, "results": []}
    with server(args.database_url) as base_url:
        url = fresh_database(base_url, "runlease_bench_claim")
        figures["server"] = psycopg.connect(url).execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        enqueue_s = load_store(url, args.jobs, limits=False)
        figures["enqueue_jobs_per_s"] = args.jobs / enqueue_s
        rows = []
        for batch in batches:
            for k in ks:
                rates = {kind: measure(url, kind, k, batch, args.jobs)
                         for kind in ("raw", "raw_async", "schema", "store", "limits")}
                result = {"claimers": k, "batch": batch, **{f"{kind}_jobs_per_s": rate
                                                           for kind, rate in rates.items()},
                          "store_vs_raw": rates["store"] / rates["raw"],
                          "schema_vs_raw": rates["schema"] / rates["raw"],
                          "limits_vs_store": rates["limits"] / rates["store"]}
                figures["results"].append(result)
                result["store_vs_raw_async"] = rates["store"] / rates["raw_async"]
                rows.append([k, batch, rates["raw"], rates["raw_async"], rates["schema"],
                             rates["store"], rates["limits"], result["schema_vs_raw"],
                             result["store_vs_raw"],
                             result["store_vs_raw_async"], result["limits_vs_store"]])
                if not args.json:
                    print(f"  measured K={k} batch={batch}", file=sys.stderr)
    if args.json:
        emit_json(figures)
        return
    print(f"\nclaim + ack of {args.jobs:,} runs, PostgreSQL {figures['server']}, "
          f"enqueue {figures['enqueue_jobs_per_s']:,.0f} runs/s (batches of 1000)\n")
    print_table(["K", "batch", "raw", "raw async", "schema", "store", "store+limits",
                 "schema/raw", "store/raw",
                 "store/raw async", "limits/store"], rows)
    print("\n(jobs/s; raw = the seed's statements through sync psycopg, raw async = the same "
          "through psycopg's asyncio API, which the store uses; schema = the seed's "
          "statements on runlease's agent_runs)")


if __name__ == "__main__":
    main()
