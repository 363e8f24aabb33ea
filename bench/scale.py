"""Costs at agent scale: does what waits slow what runs? (issue 16)

    python bench/scale.py [--database-url URL] [--quick] [--json]

Target 1, claim flat under backlog: an uncapped tenant's claim+ack rate (one
connection, claim 1 then ack, RunStore; twice each, alternated, the best
of each kept) on an empty pool, then with a
backlog of pending runs of tenants at their caps (each holds its cap of
leased runs), runs in backoff (available in an hour) of other tenants,
placed at the head of the fair order where a retry lands, and the same
backlog in a paused pool. Full size: 1,000,000 capped pending runs of 50
tenants + 100,000 delayed (the issue's repro); --quick: 100,000 + 10,000.
The figure is rate(backlog) / rate(empty).

Target 2, heartbeat and reaper flat in leases: one run_heartbeat statement
renewing 10, 100, 1,000, 10,000 leases (median of a few), among 100,000 live
leases (--quick: 20,000); then one reaper batch (run_reap) and one
retention batch (run_retention_by_pool) with those live leases, against the
same with no live lease. The live leases' ids are older than the retention
cutoff (the worst case for a scan bounded by id).

Target 3, queue stats: the operator's queue_stats over the target-1
backlog, p99 of a few calls.

Targets 4-7 are not measured here (streams, bench/throughput.py for the
drain, memory, PgBouncer); they are listed with no value.

Without --database-url an embedded PostgreSQL is started, with fsync off
unless --durable: what is measured is the work of a statement, and on a
shared machine a commit's fsync is mostly the neighbours' noise. Figures
are printed; nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import emit_json, fresh_database, machine, print_table, server

from runlease.db.connect import make_pool
from runlease.db.queries import sql
from runlease.db.store import NewRun, RunStore

CAPPED_TENANTS = 50
CAP = 2


def uuid7_sql(age: str, seq: str) -> str:
    """An SQL expression for a UUIDv7-shaped id `age` ago, unique by `seq`."""
    return (f"(lpad(to_hex((extract(epoch FROM now() - interval '{age}') * 1000)::bigint),"
            f" 12, '0') || '7000' || '8' || lpad(to_hex({seq}), 15, '0'))::uuid")


def load_backlog(url: str, pool: str, capped: int, delayed: int) -> None:
    """Capped tenants' pending runs interleaved in the fair order from 0, each
    tenant holding CAP leased runs; delayed runs of 100 other tenants at the
    head of the order, available in an hour."""
    per_tenant = capped // CAPPED_TENANTS
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO agent_run_pools (name, default_max_in_flight) VALUES (%s, NULL)"
            " ON CONFLICT (name) DO NOTHING", (pool,))
        conn.execute(
            "INSERT INTO agent_run_tenant_limits (pool, tenant_id, max_in_flight)"
            " SELECT %s, 'capped-' || t, %s FROM generate_series(1, %s) t"
            " ON CONFLICT DO NOTHING", (pool, CAP, CAPPED_TENANTS))
        conn.execute(
            f"INSERT INTO agent_runs (id, pool, tenant_id, status, fair_seq, input_json)"
            f" SELECT gen_random_uuid(), %s, 'capped-' || (i %% {CAPPED_TENANTS} + 1), 'pending',"
            f"        i / {CAPPED_TENANTS}, '{{}}'"
            f"   FROM generate_series(0, %s - 1) i", (pool, per_tenant * CAPPED_TENANTS))
        # As run_nack leaves them: since migration 0006 flagged `delayed`.
        flagged = conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'agent_runs' AND column_name = 'delayed'").fetchone()
        conn.execute(
            "INSERT INTO agent_runs (id, pool, tenant_id, status, fair_seq, input_json,"
            "                        attempts, available_at)"
            " SELECT gen_random_uuid(), %s, 'retrying-' || (i %% 100), 'pending', i / 100, '{}',"
            "        1, now() + interval '1 hour'"
            "   FROM generate_series(0, %s - 1) i", (pool, delayed))
        if flagged and flagged[0]:
            conn.execute("UPDATE agent_runs SET delayed = true"
                         " WHERE pool = %s AND status = 'pending' AND available_at > now()",
                         (pool,))
        conn.execute(
            "INSERT INTO agent_runs (id, pool, tenant_id, status, fair_seq, input_json,"
            "                        attempts, lease_epoch, locked_by, locked_until)"
            " SELECT gen_random_uuid(), %s, 'capped-' || (i %% %s + 1), 'leased', 0, '{}',"
            "        1, 1, 'elsewhere', now() + interval '1 hour'"
            "   FROM generate_series(0, %s - 1) i", (pool, CAPPED_TENANTS, CAPPED_TENANTS * CAP))
        conn.execute("VACUUM ANALYZE agent_runs")


def claim_rate(url: str, pool: str, runs: int) -> dict[str, float]:
    """Enqueue `runs` for a fresh uncapped tenant, then claim 1 + ack until
    they are all done; claims/s overall and in the last tenth."""
    async def go() -> dict[str, float]:
        async with make_pool(url, min_size=1, max_size=1) as conns:
            store = RunStore(conns)
            tenant = f"fresh-{time.monotonic_ns()}"
            for i in range(0, runs, 1000):
                await store.enqueue_many(pool, [NewRun(tenant, {"i": j})
                                                for j in range(i, min(runs, i + 1000))])
            async with conns.connection() as conn:
                done = 0
                t0 = time.perf_counter()
                tail_at = runs - runs // 10
                t_tail = t0
                while leases := await store.claim(pool, "bench", 1, conn=conn):
                    if leases[0].run.tenant_id != tenant:
                        raise RuntimeError(f"claimed another tenant's run: {leases[0]}")
                    await store.ack(leases[0], conn=conn)
                    done += 1
                    if done == tail_at:
                        t_tail = time.perf_counter()
                t1 = time.perf_counter()
            if done != runs:
                raise RuntimeError(f"claimed {done} of {runs}")
            return {"rate": done / (t1 - t0), "tail_rate": (runs - tail_at) / (t1 - t_tail)}

    return asyncio.run(go())


def target1(url: str, quick: bool, runs: int | None = None) -> dict[str, Any]:
    capped = 100_000 if quick else 1_000_000
    delayed = 10_000 if quick else 100_000
    runs = runs or (1_000 if quick else 2_000)
    empty_db = fresh_database(url, "scale_empty")
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("INSERT INTO agent_run_pools (name) VALUES ('work')")
        # The same limit configuration as under backlog, so the limit path runs.
        conn.execute("INSERT INTO agent_run_tenant_limits (pool, tenant_id, max_in_flight)"
                     " SELECT 'work', 'capped-' || t, %s FROM generate_series(1, %s) t",
                     (CAP, CAPPED_TENANTS))
    db = fresh_database(url, "scale_backlog")
    t0 = time.perf_counter()
    load_backlog(db, "work", capped, delayed)
    with psycopg.connect(db, autocommit=True) as conn:
        # The same backlog again in a paused pool.
        conn.execute("INSERT INTO agent_run_pools (name, paused) VALUES ('sleeping', true)")
    load_backlog(db, "sleeping", capped // 2, delayed // 2)
    load_s = time.perf_counter() - t0
    # Alternated and the best of each kept: the machine is shared, and a
    # neighbour's burst should not decide the ratio.
    empties, backlogs = [], []
    for _ in range(2):
        empties.append(claim_rate(empty_db, "work", runs))
        backlogs.append(claim_rate(db, "work", runs))
    empty = max(empties, key=lambda r: r["rate"])
    backlog = max(backlogs, key=lambda r: r["rate"])
    stats = queue_stats_p99(db, "work")
    return {"capped_pending": capped, "delayed": delayed, "paused_pool_pending":
            capped // 2 + delayed // 2, "claimed": runs, "load_s": load_s,
            "empty_rate": empty["rate"], "backlog_rate": backlog["rate"],
            "backlog_tail_rate": backlog["tail_rate"],
            "ratio": backlog["rate"] / empty["rate"],
            "tail_ratio": backlog["tail_rate"] / empty["tail_rate"],
            "stats_p99_ms": stats}


def queue_stats_p99(url: str, pool: str, calls: int = 20) -> float:
    async def go() -> float:
        async with make_pool(url, min_size=1, max_size=1) as conns:
            store = RunStore(conns)
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                await store.queue_stats(pool)
                times.append(time.perf_counter() - t0)
            return sorted(times)[max(0, int(len(times) * 0.99) - 1)] * 1000

    return asyncio.run(go())


def timed(conn: psycopg.Connection[Any], name: str, params: dict[str, Any],
          reps: int = 5) -> float:
    """Median milliseconds of one named statement, rolled back each time."""
    times = []
    for _ in range(reps):
        with conn.transaction(force_rollback=True):
            t0 = time.perf_counter()
            conn.execute(sql(name), params, prepare=True).fetchall()
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def target2(url: str, quick: bool) -> dict[str, Any]:
    live = 20_000 if quick else 100_000
    db = fresh_database(url, "scale_leases")
    out: dict[str, Any] = {"live_leases": live}
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO agent_run_pools (name, retention_s) VALUES ('work', 3600)")
        # Nothing live yet: the reaper's and retention's fixed cost.
        out["reap_ms_none"] = timed(conn, "run_reap", {"batch": 1000, "now": None,
                                                       "channel_prefix": "bench_"})
        out["retention_ms_none"] = timed(conn, "run_retention_by_pool",
                                         {"batch": 1000, "now": None})
        conn.execute(
            f"INSERT INTO agent_runs (id, pool, tenant_id, status, input_json, attempts,"
            f"                        lease_epoch, locked_by, locked_until, created_at)"
            f" SELECT {uuid7_sql('2 hours', 'i')}, 'work', 't' || (i %% 100), 'leased', '{{}}',"
            f"        1, 1, CASE WHEN i <= 10000 THEN 'hb-0' ELSE 'hb-' || (i %% 9 + 1) END,"
            f"        now() + interval '1 hour',"
            f"        now() - interval '2 hours'"
            f"   FROM generate_series(1, %s) i", (live,))
        conn.execute("VACUUM ANALYZE agent_runs")
        # Leases of one worker: 'hb-0' holds 10,000 of them.
        held = [r[0] for r in conn.execute(
            "SELECT id FROM agent_runs WHERE locked_by = 'hb-0' ORDER BY id").fetchall()]
        curve = {}
        for n in (10, 100, 1_000, 10_000):
            if n > len(held):
                break
            curve[n] = timed(conn, "run_heartbeat", {
                "worker": "hb-0", "ids": held[:n], "epochs": [1] * n, "lease_s": None,
                "now": None})
        out["heartbeat_ms"] = curve
        out["heartbeat_1000_over_10"] = curve[1_000] / curve[10]
        out["reap_ms"] = timed(conn, "run_reap", {"batch": 1000, "now": None,
                                                  "channel_prefix": "bench_"})
        out["retention_ms"] = timed(conn, "run_retention_by_pool",
                                    {"batch": 1000, "now": None})
        for name, params in (("run_reap", "1000, NULL, 'bench_'"),
                             ("run_retention_by_pool", "1000, NULL")):
            out[name + "_plan"] = explain_rows(conn, name, params)
    return out


def explain_rows(conn: psycopg.Connection[Any], name: str, args: str) -> dict[str, int]:
    """Rows a statement read (scanned + removed by filter), from EXPLAIN ANALYZE."""
    text = sql(name)
    for key in ("batch", "now", "channel_prefix"):
        text = text.replace(f"%({key})s", "$" + str(("batch", "now", "channel_prefix")
                                                      .index(key) + 1))
    with conn.transaction(force_rollback=True):
        conn.execute(f"PREPARE scale_probe AS {text}")  # type: ignore[arg-type]
        plan = conn.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE scale_probe ({args})"  # type: ignore[arg-type]
        ).fetchone()[0][0]["Plan"]  # type: ignore[index]
        conn.execute("DEALLOCATE scale_probe")
    read = [0, 0]

    def walk(node: dict[str, Any]) -> None:
        if "Scan" in node["Node Type"]:
            read[0] += int(node.get("Actual Rows", 0) * node.get("Actual Loops", 1))
            read[1] += int(node.get("Rows Removed by Filter", 0))
        for child in node.get("Plans", []):
            walk(child)

    walk(plan)
    return {"rows_returned_by_scans": read[0], "rows_removed_by_filter": read[1]}


def targets(t1: dict[str, Any] | None, t2: dict[str, Any] | None) -> list[dict[str, Any]]:
    def item(name: str, value: Any, target: str, met: bool | None) -> dict[str, Any]:
        return {"name": name, "value": value, "target": target, "met": met}

    out = []
    if t1:
        out.append(item("1. claim flat under backlog (rate with backlog / empty)",
                        round(t1["ratio"], 3), ">= 0.7", t1["ratio"] >= 0.7))
    if t2:
        reads = (t2["run_reap_plan"]["rows_returned_by_scans"]
                 + t2["run_reap_plan"]["rows_removed_by_filter"]
                 + t2["run_retention_by_pool_plan"]["rows_returned_by_scans"]
                 + t2["run_retention_by_pool_plan"]["rows_removed_by_filter"])
        ratio = t2["heartbeat_1000_over_10"]
        out.append(item("2. heartbeat of 1,000 / of 10 leases", round(ratio, 2), "< 10",
                        ratio < 10))
        out.append(item(f"2. rows read by reaper + retention with {t2['live_leases']:,}"
                        " live leases, none expired", reads, "0 (batch-bounded)",
                        reads == 0))
    if t1:
        out.append(item("3. queue stats p99 ms over the backlog",
                        round(t1["stats_p99_ms"], 1), "< 50", t1["stats_p99_ms"] < 50))
    for name in ("4. streams by the thousand (not measured; only the per-tenant cap is done)",
                 "5. faster drain (bench/throughput.py)", "6. memory (bench/soak.py)",
                 "7. behind PgBouncer"):
        out.append(item(name, None, "see docs/benchmarks.md", None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url")
    ap.add_argument("--quick", action="store_true", help="smaller backlogs (minutes)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", choices=("1", "2"), help="one target's measurement")
    ap.add_argument("--durable", action="store_true", help="fsync on (as in production)")
    ap.add_argument("--runs", type=int, help="runs the fresh tenant claims (target 1)")
    ap.add_argument("--soak", action="store_true",
                    help="target 6: bench/soak.py --quick on the same server (+3 minutes)")
    args = ap.parse_args()
    with server(args.database_url, durable=args.durable) as url:
        t1 = target1(url, args.quick, args.runs) if args.only in (None, "1") else None
        t2 = target2(url, args.quick) if args.only in (None, "2") else None
    result = {"quick": args.quick, "durable": args.durable, "machine": machine(),
              "date": time.strftime("%Y-%m-%d"),
              "claim": t1, "leases": t2, "targets": targets(t1, t2)}
    if args.soak:  # target 6 (bench/soak.py), after the others: it loads the machine
        import soak

        result["soak"] = soak.measure(args.database_url, quick=True)
        result["targets"] = soak.with_memory(result["targets"], result["soak"])
    if args.json:
        emit_json(result)
        return
    if t1:
        print(f"claim+ack, one connection, {t1['claimed']:,} runs of a fresh tenant:")
        print_table(["queue", "claims/s", "last tenth /s"], [
            ["empty", t1["empty_rate"], t1["empty_rate"]],
            [f"{t1['capped_pending']:,} capped + {t1['delayed']:,} delayed"
             f" (+ {t1['paused_pool_pending']:,} paused)", t1["backlog_rate"],
             t1["backlog_tail_rate"]]])
        print()
    if t2:
        print(f"heartbeat (ms, one statement) among {t2['live_leases']:,} live leases:")
        print_table(["leases", "ms"], [[n, ms] for n, ms in t2["heartbeat_ms"].items()])
        print()
    print_table(["target", "value", "goal", "met"],
                [[t["name"], "-" if t["value"] is None else t["value"], t["target"],
                  "-" if t["met"] is None else str(t["met"])] for t in result["targets"]])


if __name__ == "__main__":
    main()
