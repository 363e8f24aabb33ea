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

Target 2, heartbeat and reaper flat in leases (issue 26's target 2): a
lease belongs to its worker's incarnation (migration 0015), so a heartbeat
(worker_heartbeat) renews one row of agent_run_workers whatever the runs
held. Timed: the heartbeat of a worker holding 10, 100, 1,000, 10,000
leases (15 beats of each, committed; the median and the best reported, the
best deciding the target as for target 1), among 100,000 live leases
(--quick: 20,000) of 10 registered workers, as a prepared statement both
with the server's plan choice and forced generic (what the lease keeper's
prepared statement settles on). Target: 1,000 / 10 < 2. Then one reaper
batch (run_reap) and one retention batch (run_retention_by_pool) with those
live leases, against the same with no live lease: rows of agent_runs read,
from EXPLAIN ANALYZE. The live leases' ids are older than the retention
cutoff (the worst case for a scan bounded by id). Beside the curve, what
the old design paid: the plainest renewal of one row per lease (UPDATE ...
SET locked_until WHERE id = ANY(ids) AND locked_by = me) of a four-column
table holding as many live leases, same counts, same plans.

Target 3, queue stats: what the operator reads each pass (queue_stats, then
startable_runs), p99 of 100 calls, over the target-1 backlog (1,650,000
runs; --quick: 165,000), after one fold of the counts' deltas.

Targets 8 and 9 (issue 26's 1 and 3): bench/burst.py on this server, a
burst of 20,000 no-op runs drained by two worker processes (c=50) after
four histories of the table (analyzed; analyzed empty, then the burst;
truncated; 1,000,000 done runs analyzed), each stale state's drain over the
analyzed one's (>= 0.9); the same drain over PgQueuer's (>= 3) and over the
raw claim-50 + ack floor's (>= 0.5), after ANALYZE and in the burst case
(no ANALYZE for anyone).

Targets 27.1 and 27.2 (issue 27): bench/threads_keys.py, the claim with
100,000 runs behind 1,000 busy threads and 1,000 keys at their limits over
the empty claim, and a submit into a thread's p99 over a plain submit's.

Target 4, streams: bench/scale_streams.py. Targets 5 and 7, the drain
against PgQueuer and the raw floor, and through PgBouncer:
bench/throughput.py's drains on this server (--quick: 10,000 no-op runs,
P = 1, 2 worker processes, P = 2 also through PgBouncer; else 20,000 runs,
P = 1, 2, 4, best of two). Target 6, memory: bench/soak.py on this server
(--quick: 90 seconds after the warm-up; else 10 minutes). The whole --quick
run takes seven to ten minutes on 2 shared cores (the bursts of targets 8
and 9 about four of them).

The targets are a registry (TARGETS): each entry names the key of its
section in the JSON and a function (server URL, quick) -> {"details": ...,
"targets": [item(...), ...]}; a target another module measures is one line,
`external("module:measure", "module:targets")`.

Without --database-url an embedded PostgreSQL is started, with fsync off
unless --durable: what is measured is the work of a statement, and on a
shared machine a commit's fsync is mostly the neighbours' noise. Figures
are printed; nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import emit_json, fresh_database, incarnation, machine, print_table, server

from runlease.db.connect import make_conn_pool
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
        # The caps' leases, held by a live worker (its row is their lease).
        conn.execute(
            "INSERT INTO agent_run_workers (id, pool, version, concurrency, started_at,"
            "                               heartbeat_at, expires_at)"
            " VALUES ('elsewhere', %s, 'bench', 1000, now(), now(), now() + interval '1 hour')"
            " ON CONFLICT (id) DO NOTHING", (pool,))
        conn.execute(
            "INSERT INTO agent_runs (id, pool, tenant_id, status, fair_seq, input_json,"
            "                        attempts, lease_epoch, locked_by)"
            " SELECT gen_random_uuid(), %s, 'capped-' || (i %% %s + 1), 'leased', 0, '{}',"
            "        1, 1, 'elsewhere'"
            "   FROM generate_series(0, %s - 1) i", (pool, CAPPED_TENANTS, CAPPED_TENANTS * CAP))
        conn.execute("VACUUM ANALYZE agent_runs")


def claim_rate(url: str, pool: str, runs: int) -> dict[str, float]:
    """Enqueue `runs` for a fresh uncapped tenant, then claim 1 + ack until
    they are all done; claims/s overall and in the last tenth."""
    async def go() -> dict[str, float]:
        async with make_conn_pool(url, min_size=1, max_size=1) as conn_pool:
            store = RunStore(conn_pool)
            tenant = f"fresh-{time.monotonic_ns()}"
            for i in range(0, runs, 1000):
                await store.enqueue_many(pool, [NewRun(tenant, {"i": j})
                                                for j in range(i, min(runs, i + 1000))])
            holder = await incarnation(store, "bench", pool)
            async with conn_pool.connection() as conn:
                done = 0
                t0 = time.perf_counter()
                tail_at = runs - runs // 10
                t_tail = t0
                while leases := await store.claim(pool, holder, 1, conn=conn):
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
    return {"capped_pending": capped, "delayed": delayed, "paused_pool_pending":
            capped // 2 + delayed // 2, "claimed": runs, "load_s": load_s,
            "empty_rate": empty["rate"], "backlog_rate": backlog["rate"],
            "backlog_tail_rate": backlog["tail_rate"],
            "ratio": backlog["rate"] / empty["rate"],
            "tail_ratio": backlog["tail_rate"] / empty["tail_rate"]}


def stats_p99(url: str, pool: str, calls: int = 100) -> dict[str, float]:
    """p99 ms of what the operator reads each pass (queue_stats, then
    startable_runs), and of queue_stats alone."""
    async def go() -> dict[str, float]:
        async with make_conn_pool(url, min_size=1, max_size=1) as conn_pool:
            store = RunStore(conn_pool)
            await store.fold_counts()  # as the reaper's leader does every pass
            both, alone = [], []
            for _ in range(calls):
                t0 = time.perf_counter()
                await store.queue_stats(pool)
                t1 = time.perf_counter()
                await store.startable_runs(pool)
                t2 = time.perf_counter()
                alone.append(t1 - t0)
                both.append(t2 - t0)

            def p99(times: list[float]) -> float:
                return sorted(times)[max(0, int(len(times) * 0.99) - 1)] * 1000

            return {"p99_ms": p99(both), "queue_stats_p99_ms": p99(alone)}

    return asyncio.run(go())


def target3(url: str, quick: bool) -> dict[str, Any]:
    """Over target 1's backlog when it was loaded, else a backlog of its own."""
    capped = 100_000 if quick else 1_000_000
    delayed = 10_000 if quick else 100_000
    db = database_url(url, "scale_backlog")
    try:
        with psycopg.connect(db) as conn:
            row = conn.execute("SELECT count(*) FROM agent_runs").fetchone()
        runs = int(row[0]) if row else 0
    except psycopg.OperationalError:
        runs = 0
    if runs < capped:
        db = fresh_database(url, "scale_backlog")
        load_backlog(db, "work", capped, delayed)
        with psycopg.connect(db) as conn:
            row = conn.execute("SELECT count(*) FROM agent_runs").fetchone()
        runs = int(row[0]) if row else 0
    return {"runs": runs, **stats_p99(db, "work")}


def database_url(url: str, name: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["dbname"] = name
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def timings(conn: psycopg.Connection[Any], name: str, params: dict[str, Any],
            reps: int = 5, *, commit: bool = False) -> list[float]:
    """Milliseconds of each of `reps` runs of one named statement, committed
    or rolled back."""
    times = []
    for _ in range(reps):
        with conn.transaction(force_rollback=not commit):
            t0 = time.perf_counter()
            conn.execute(sql(name), params, prepare=True).fetchall()
            times.append((time.perf_counter() - t0) * 1000)
    return times


def timed(conn: psycopg.Connection[Any], name: str, params: dict[str, Any],
          reps: int = 5, *, commit: bool = False) -> float:
    """Median milliseconds of one named statement, committed or rolled back."""
    return statistics.median(timings(conn, name, params, reps, commit=commit))


WORKERS = 10


HEARTBEATS = 15

# Leases held by each of the measured workers; the other WORKERS - 4 hold the
# rest of the live leases.
HELD = (10, 100, 1_000, 10_000)


def holder(n: int) -> str:
    return f"hb-holds-{n}"


def heartbeat_curve(db: str, plan_mode: str) -> dict[int, list[float]]:
    """Milliseconds of each of HEARTBEATS heartbeats (worker_heartbeat) of the
    worker holding n leases, prepared, committed, under plan_mode."""
    curve = {}
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"SET plan_cache_mode = {plan_mode}")  # type: ignore[arg-type]
        for n in HELD:
            curve[n] = timings(conn, "worker_heartbeat", {
                "worker": holder(n), "lease_s": 3600, "now": None, "runs_held": n,
                "stale_writes": 0}, reps=HEARTBEATS, commit=True)
            if not curve[n]:
                raise RuntimeError(f"no heartbeat of {holder(n)}")
    return curve


FLOOR_RENEWAL = ("UPDATE bench_lease_floor SET locked_until = now() + interval '1 hour'"
                 " WHERE id = ANY (%(ids)b::uuid[]) AND locked_by = %(worker)s")


def floor_curve(db: str, live: int, plan_mode: str) -> dict[int, list[float]]:
    """Milliseconds of each of HEARTBEATS plainest renewals of n rows of a
    four-column lease table (one row per lease, fillfactor as agent_runs'),
    prepared, committed, under plan_mode."""
    curve = {}
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_lease_floor (id uuid PRIMARY KEY,"
                     " locked_by text NOT NULL, lease_epoch bigint NOT NULL,"
                     " locked_until timestamptz NOT NULL) WITH (fillfactor = 50)")
        conn.execute("TRUNCATE bench_lease_floor")
        conn.execute("INSERT INTO bench_lease_floor SELECT gen_random_uuid(),"
                     " CASE WHEN i <= 10000 THEN 'hb-0' ELSE 'hb-' || (i %% 9 + 1) END, 1,"
                     " now() + interval '1 hour' FROM generate_series(1, %s) i", (live,))
        conn.execute("VACUUM ANALYZE bench_lease_floor")
        held = [r[0] for r in conn.execute(
            "SELECT id FROM bench_lease_floor WHERE locked_by = 'hb-0' ORDER BY id")]
        conn.execute(f"SET plan_cache_mode = {plan_mode}")  # type: ignore[arg-type]
        for n in HELD:
            if n > len(held):
                break
            times = []
            for _ in range(HEARTBEATS):
                t0 = time.perf_counter()
                conn.execute(FLOOR_RENEWAL, {"ids": held[:n], "worker": "hb-0"}, prepare=True)
                times.append((time.perf_counter() - t0) * 1000)
            curve[n] = times
    return curve


def heartbeat_figures(auto: dict[int, list[float]],
                      generic: dict[int, list[float]]) -> dict[str, Any]:
    """Median and best of each curve; the 1,000 / 10 ratios, each the worse of
    the two plans. The best decides the target, as target 1 keeps the best of
    its runs: on a shared machine a statement of 5 ms is cut by a neighbour's
    time slice far more often than one of 0.5 ms, which a median counts as
    the statement's own cost."""
    out: dict[str, Any] = {}
    for key, pick in (("", statistics.median), ("_best", min)):
        out[f"heartbeat{key}_ms"] = {n: pick(t) for n, t in auto.items()}
        out[f"heartbeat{key}_ms_generic"] = {n: pick(t) for n, t in generic.items()}
        out[f"heartbeat{key}_1000_over_10"] = max(
            c[1_000] / c[10] for c in (out[f"heartbeat{key}_ms"],
                                        out[f"heartbeat{key}_ms_generic"]))
    return out


def target2(url: str, quick: bool) -> dict[str, Any]:
    live = 20_000 if quick else 100_000
    if live <= sum(HELD):
        raise ValueError(f"{live} live leases: fewer than the measured holders need")
    db = fresh_database(url, "scale_leases")
    out: dict[str, Any] = {"live_leases": live, "workers": WORKERS,
                           "held_by_measured_workers": list(HELD)}
    reap = {"batch": 1000, "now": None, "channel_prefix": "bench_", "ids": [],
            "events_channel": "bench_events"}
    retention = {"batch": 1000, "now": None}
    others = [f"hb-{w}" for w in range(WORKERS - len(HELD))]
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO agent_run_pools (name, retention_s) VALUES ('work', 3600)")
        # Nothing live yet: the reaper's and retention's fixed cost.
        out["reap_ms_none"] = timed(conn, "run_reap", reap)
        out["retention_ms_none"] = timed(conn, "run_retention_by_pool", retention)
        out["run_reap_plan_none"] = explain_rows(conn, "run_reap", reap)
        out["run_retention_by_pool_plan_none"] = explain_rows(conn, "run_retention_by_pool",
                                                              retention)
        # The workers are alive: registered, their rows fresh (each row is
        # the lease of every run it holds).
        conn.execute(
            "INSERT INTO agent_run_workers (id, pool, version, concurrency, started_at,"
            "                               heartbeat_at, expires_at)"
            " SELECT w, 'work', 'bench', 10000, now(), now(), now() + interval '1 hour'"
            "   FROM unnest(%s::text[]) w", ([holder(n) for n in HELD] + others,))
        # Runs 1..sum(HELD) go to the measured holders (n each), the rest
        # round-robin to the others.
        bounds = []
        first = 1
        for n in HELD:
            bounds.append(f"WHEN i < {first + n} THEN '{holder(n)}'")
            first += n
        conn.execute(
            f"INSERT INTO agent_runs (id, pool, tenant_id, status, input_json, attempts,"
            f"                        lease_epoch, locked_by, created_at)"
            f" SELECT {uuid7_sql('2 hours', 'i')}, 'work', 't' || (i %% 100), 'leased', '{{}}',"
            f"        1, 1, CASE {' '.join(bounds)}"
            f"                   ELSE 'hb-' || (i %% {len(others)}) END,"
            f"        now() - interval '2 hours'"
            f"   FROM generate_series(1, %s) i", (live,))
        conn.execute("UPDATE agent_run_workers w SET runs_held = (SELECT count(*) FROM"
                     " agent_runs r WHERE r.locked_by = w.id)")
        conn.execute("VACUUM ANALYZE agent_runs")
        conn.execute("VACUUM ANALYZE agent_run_workers")
        out["reap_ms"] = timed(conn, "run_reap", reap)
        out["retention_ms"] = timed(conn, "run_retention_by_pool", retention)
        out["run_reap_plan"] = explain_rows(conn, "run_reap", reap)
        out["run_retention_by_pool_plan"] = explain_rows(conn, "run_retention_by_pool",
                                                         retention)
        out["worker_heartbeat_plan"] = explain_rows(conn, "worker_heartbeat", {
            "worker": holder(HELD[-1]), "lease_s": 3600, "now": None,
            "runs_held": HELD[-1], "stale_writes": 0})
        left = conn.execute("SELECT count(*) FROM agent_runs WHERE status = 'leased'").fetchone()
        if not left or left[0] != live:
            raise RuntimeError(f"live leases lost during the measurement: {left}")
    out |= heartbeat_figures(heartbeat_curve(db, "auto"),
                             heartbeat_curve(db, "force_generic_plan"))
    floor = heartbeat_figures(floor_curve(db, live, "auto"),
                              floor_curve(db, live, "force_generic_plan"))
    out |= {f"floor_{key}": value for key, value in floor.items()}
    return out


def explain_rows(conn: psycopg.Connection[Any], name: str,
                 params: dict[str, Any]) -> dict[str, int]:
    """Rows a statement's scans read (returned + removed by filter), from
    EXPLAIN ANALYZE through auto_explain; the statement is rolled back."""
    plans: list[dict[str, Any]] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1])["Plan"])

    conn.add_notice_handler(keep)
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("LOAD 'auto_explain'")
            for key, value in [("log_min_duration", "0"), ("log_analyze", "on"),
                               ("log_format", "json"), ("log_level", "notice")]:
                conn.execute(f"SET LOCAL auto_explain.{key} = {value}")  # type: ignore[arg-type]
            conn.execute(sql(name), params).fetchall()
    finally:
        conn.remove_notice_handler(keep)
    read = [0, 0]

    def walk(node: dict[str, Any]) -> None:
        if "Scan" in node["Node Type"] and node.get("Relation Name") == "agent_runs":
            read[0] += int(node.get("Actual Rows", 0) * node.get("Actual Loops", 1))
            read[1] += int(node.get("Rows Removed by Filter", 0))
        for child in node.get("Plans", []):
            walk(child)

    walk(plans[-1])
    return {"rows_returned_by_scans": read[0], "rows_removed_by_filter": read[1]}


def item(name: str, value: Any, target: str, met: bool | None) -> dict[str, Any]:
    return {"name": name, "value": value, "target": target, "met": met}


def claim_targets(t1: dict[str, Any]) -> list[dict[str, Any]]:
    return [item("1. claim flat under backlog (rate with backlog / empty)",
                 round(t1["ratio"], 3), ">= 0.7", t1["ratio"] >= 0.7)]


def lease_targets(t2: dict[str, Any]) -> list[dict[str, Any]]:
    def total(plan: dict[str, int]) -> int:
        return plan["rows_returned_by_scans"] + plan["rows_removed_by_filter"]

    reads = total(t2["run_reap_plan"]) + total(t2["run_retention_by_pool_plan"])
    reads_none = (total(t2["run_reap_plan_none"])
                  + total(t2["run_retention_by_pool_plan_none"]))
    ratio = t2["heartbeat_best_1000_over_10"]
    hb_reads = total(t2["worker_heartbeat_plan"])
    # What the reaper cannot avoid: one descent per worker holding leases.
    return [
        item(f"2. heartbeat of the worker holding 1,000 leases / of the one holding 10"
             f" ({t2['workers']} workers, {t2['live_leases']:,} live leases; best of"
             f" {HEARTBEATS}; worse of server-chosen and generic plans; of the medians:"
             f" {t2['heartbeat_1000_over_10']:.2f}; rows of agent_runs a heartbeat of"
             f" 10,000 leases reads: {hb_reads}; one row per lease, a four-column table:"
             f" {t2['floor_heartbeat_best_1000_over_10']:.1f})",
             round(ratio, 2), "< 2 (one row per worker)", ratio < 2),
        item(f"2. rows read by reaper + retention with {t2['live_leases']:,} live leases of"
             f" {t2['workers']} live workers, none expired", reads,
             f"<= {reads_none} + {2 * t2['workers']} (as with none; one descent per worker)",
             reads <= reads_none + 2 * t2["workers"]),
    ]


def stats_targets(t3: dict[str, Any]) -> list[dict[str, Any]]:
    return [item(f"3. queue stats + startable runs p99 ms over {t3['runs']:,} runs",
                 round(t3["p99_ms"], 1), "< 50", t3["p99_ms"] < 50)]


Measured = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """One numbered target: `section` is its key in the JSON output;
    `measure(url, quick)` returns {"details": ..., "targets": [item(...)]}."""

    key: str
    section: str
    measure: Callable[[str, bool], Measured]


def external(measure_spec: str, targets_spec: str) -> Callable[[str, bool], Measured]:
    """A target measured by another bench module: "module:function" of its
    measurement, (server URL, quick) -> figures, and of its targets,
    figures -> [item(...)] (imported when measured, from bench/)."""
    def find(spec: str) -> Any:
        module, function = spec.split(":")
        return getattr(importlib.import_module(module), function)

    def measure(url: str, quick: bool) -> Measured:
        figures = find(measure_spec)(url, quick)
        return {"details": figures, "targets": find(targets_spec)(figures)}

    return measure


def _claim(url: str, quick: bool) -> Measured:
    t1 = target1(url, quick, RUNS[0])
    return {"details": t1, "targets": claim_targets(t1)}


def _leases(url: str, quick: bool) -> Measured:
    t2 = target2(url, quick)
    return {"details": t2, "targets": lease_targets(t2)}


def _stats(url: str, quick: bool) -> Measured:
    t3 = target3(url, quick)
    return {"details": t3, "targets": stats_targets(t3)}


RUNS: list[int | None] = [None]  # --runs, for target 1

TARGETS: list[Target] = [
    Target("1", "claim", _claim),
    Target("2", "leases", _leases),
    # Over target 1's backlog (after it), or one of its own.
    Target("3", "stats", _stats),
    Target("4", "streams", external("scale_streams:measure", "scale_streams:targets")),
    # Both 5 and 7: the drains, direct and through PgBouncer (bench/throughput.py).
    Target("5", "drain", external("throughput:measure", "throughput:targets")),
    # Issue 26's targets 1 and 3: a burst of 20,000 runs onto an idle queue
    # whose statistics are stale, beside PgQueuer and the raw floor.
    Target("8", "burst", external("burst:measure", "burst:targets")),
    # Issue 27's: the claim behind 1,000 busy threads and 1,000 full keys,
    # and a submit into a thread against a plain one (bench/threads_keys.py).
    Target("27", "threads_keys", external("threads_keys:measure", "threads_keys:targets")),
    # Last: it holds 1,000 sleeping runs and 1,000 streams for minutes.
    Target("6", "soak", external("soak:scale_measure", "soak:targets")),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url")
    ap.add_argument("--quick", action="store_true", help="smaller backlogs (minutes)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", choices=sorted({t.key for t in TARGETS}),
                    help="one target's measurement (5 measures 7 too: the same drains;"
                         " 8 measures 9 too: the same bursts)")
    ap.add_argument("--durable", action="store_true", help="fsync on (as in production)")
    ap.add_argument("--runs", type=int, help="runs the fresh tenant claims (target 1)")
    args = ap.parse_args()
    RUNS[0] = args.runs
    sections: dict[str, Any] = {t.section: None for t in TARGETS}
    items: list[dict[str, Any]] = []
    with server(args.database_url, durable=args.durable) as url:
        for t in TARGETS:
            if args.only in (None, t.key):
                measured = t.measure(url, args.quick)
                sections[t.section] = measured["details"]
                items += measured["targets"]
    items.sort(key=lambda i: i["name"].split(".")[0].zfill(3))
    result = {"quick": args.quick, "durable": args.durable, "machine": machine(),
              "date": time.strftime("%Y-%m-%d"), **sections, "targets": items}
    if args.json:
        emit_json(result)
        return
    t1, t2 = sections.get("claim"), sections.get("leases")
    if t1:
        print(f"claim+ack, one connection, {t1['claimed']:,} runs of a fresh tenant:")
        print_table(["queue", "claims/s", "last tenth /s"], [
            ["empty", t1["empty_rate"], t1["empty_rate"]],
            [f"{t1['capped_pending']:,} capped + {t1['delayed']:,} delayed"
             f" (+ {t1['paused_pool_pending']:,} paused)", t1["backlog_rate"],
             t1["backlog_tail_rate"]]])
        print()
    if t2:
        print(f"heartbeat (ms, one worker_heartbeat) among {t2['live_leases']:,} live leases:")
        print_table(["leases held", "median ms", "generic plan", "best ms", "generic plan"],
                    [[n, ms, t2["heartbeat_ms_generic"].get(n), t2["heartbeat_best_ms"].get(n),
                      t2["heartbeat_best_ms_generic"].get(n)]
                     for n, ms in t2["heartbeat_ms"].items()])
        print("\none row per lease (the old design's floor): the plainest renewal of a"
              " four-column lease table, same counts:")
        print_table(["leases", "median ms", "generic plan", "best ms", "generic plan"],
                    [[n, ms, t2["floor_heartbeat_ms_generic"].get(n),
                      t2["floor_heartbeat_best_ms"].get(n),
                      t2["floor_heartbeat_best_ms_generic"].get(n)]
                     for n, ms in t2["floor_heartbeat_ms"].items()])
        print()
    print_table(["target", "value", "goal", "met"],
                [[t["name"], "-" if t["value"] is None else t["value"], t["target"],
                  "-" if t["met"] is None else str(t["met"])] for t in items])


if __name__ == "__main__":
    main()
