"""Latencies of real `runlease worker` processes: start, cancel, crash recovery.

    python bench/latency.py [--database-url URL] [--json]

(a) enqueue -> agent start, p50/p99: one idle worker (`--start-concurrency`
    slots, agent `bench.agents:stamp`, which returns time.time() at its
    start). Runs are enqueued one at a time, 20-50 ms apart; a sample is the
    agent's start instant minus the instant enqueue returned to the client
    (both time.time() on this machine). Once with NOTIFY (the default) and
    once with --no-listen (polling only, default poll interval 2 s; those
    samples are spaced 0.1-1.5 s apart, to fall at random phases of the poll).
(b) cancel request -> cancelled, p50/p99: a run of the cooperative agent
    `bench.agents:sleeper` (ctx.sleep(60)) is leased and sleeping; from
    request_cancel returning until its status 'cancelled' is visible (polled
    every ~1 ms). The worker's own runlease_cancel_latency_seconds histogram
    is read from its /metrics as well.
(c) kill -9 -> resumed elsewhere: a long run on worker A (lease 5 s,
    heartbeat 1 s, --no-reaper); worker B (reaper leader, reaper interval
    1 s) is idle. kill -9 A; from the kill until the run's lease_epoch grows
    and B holds it. Repeated `--kill-repeats` times, each with fresh workers;
    the server's timestamps split it into lease expiry, reap and claim.

Targets (printed, not asserted): start p50 < 5 ms and p99 < 25 ms with
NOTIFY; cancel p99 < 200 ms; recovery <= lease + reaper interval + 1 s.
Without --database-url a durable embedded PostgreSQL is started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import emit_json, fresh_database, machine, print_table, server
from throughput import WorkerProc, terminate_as_interrupt, worker_fleet

from runlease.db.connect import make_pool
from runlease.db.embedded import free_port
from runlease.db.store import RunStore

T = TypeVar("T")
AConn = psycopg.AsyncConnection[dict[str, Any]]

TARGET_START_P50_MS = 5.0
TARGET_START_P99_MS = 25.0
TARGET_CANCEL_P99_MS = 200.0
KILL_LEASE_S = 5
KILL_HEARTBEAT_S = 1.0
KILL_REAPER_INTERVAL_S = 1.0
TARGET_RECOVERY_S = KILL_LEASE_S + KILL_REAPER_INTERVAL_S + 1.0
# Polling only: samples 20-50 ms apart would mostly share one poll; spread
# them over the poll interval instead.
POLL_SPACING_S = (0.1, 1.5)


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None, "min": None, "mean": None}
    ordered = sorted(values)
    if len(ordered) == 1:
        p50 = p99 = ordered[0]
    else:
        q = statistics.quantiles(ordered, n=100, method="inclusive")
        p50, p99 = q[49], q[98]
    return {"n": len(ordered), "p50": round(p50, 3), "p99": round(p99, 3),
            "max": round(ordered[-1], 3), "min": round(ordered[0], 3),
            "mean": round(statistics.fmean(ordered), 3)}


async def until(what: str, check: Callable[[], Awaitable[T | None]], timeout_s: float,
                interval_s: float = 0.01, alive: Callable[[], None] | None = None) -> T:
    """Poll check() until it returns something other than None (or False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value is not None and value is not False:
            return value
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        await asyncio.sleep(interval_s)


async def fetch_one(conn: AConn, query: str, params: Any = None) -> dict[str, Any] | None:
    cur = await conn.execute(query, params, prepare=True)
    return await cur.fetchone()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    print(f"  {name} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    yield
    print(f"  {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# (a) enqueue -> agent start
# --------------------------------------------------------------------------


async def start_latency(url: str, store: RunStore, conn: AConn, log_dir: Path, *,
                        listen: bool, samples: int, concurrency: int,
                        spacing_s: tuple[float, float], timeout_s: float) -> dict[str, Any]:
    await conn.execute("TRUNCATE agent_runs CASCADE")
    name = "start-notify" if listen else "start-poll"
    with worker_fleet(url, log_dir) as fleet:
        worker = WorkerProc(url, name, {"agent": "bench.agents:stamp",
                                        "concurrency": concurrency, "listen": listen,
                                        "reaper": False}, log_dir)
        fleet.append(worker.start())
        # Warm-up: the worker is up, connected (and listening) and has run
        # a few runs; only then is it "idle and waiting".
        if listen:
            await until("listener session", lambda: fetch_one(
                conn, "SELECT 1 AS ok FROM pg_stat_activity WHERE datname = current_database()"
                      " AND application_name = 'runlease-listen'"), 60,
                interval_s=0.05, alive=worker.check_alive)
        for i in range(3):
            warm = await store.enqueue("default", "warmup", {"warmup": i})
            await until("warm-up run", partial(has_status, conn, warm.run.id, "done"), 60,
                        interval_s=0.01, alive=worker.check_alive)
        await asyncio.sleep(0.5)

        sent: list[tuple[UUID, float, float]] = []
        for i in range(samples):
            before = time.time()
            result = await store.enqueue("default", "bench", {"i": i})
            after = time.time()
            sent.append((result.run.id, before, after))
            await asyncio.sleep(random.uniform(*spacing_s))
        ids = [s[0] for s in sent]
        await until("all start samples done", lambda: fetch_one(
            conn, "SELECT 1 AS ok WHERE NOT EXISTS (SELECT 1 FROM agent_runs"
                  " WHERE id = ANY(%s) AND status <> 'done')", (ids,)),
            timeout_s, interval_s=0.05, alive=worker.check_alive)
        cur = await conn.execute("SELECT id, result_json FROM agent_runs WHERE id = ANY(%s)",
                                 (ids,))
        started = {r["id"]: float(r["result_json"]["started"]) for r in await cur.fetchall()}
        worker.stop(grace_s=10)
    latencies = [(started[i] - after) * 1000 for i, _, after in sent]
    from_call = [(started[i] - before) * 1000 for i, before, _ in sent]
    enqueue_ms = [(after - before) * 1000 for _, before, after in sent]
    return {
        "mode": "notify" if listen else "poll only (--no-listen, poll_interval_s 2)",
        "concurrency": concurrency,
        "spacing_s": list(spacing_s),
        "start_after_enqueue_returned_ms": percentiles(latencies),
        "start_after_enqueue_called_ms": percentiles(from_call),
        "enqueue_call_ms": percentiles(enqueue_ms),
    }


# --------------------------------------------------------------------------
# (b) cancel -> cancelled
# --------------------------------------------------------------------------


def scrape_histogram(port: int, name: str) -> dict[str, Any]:
    """Count, sum and cumulative buckets of a histogram on the worker's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    buckets: dict[str, float] = {}
    count = total = 0.0
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket"):
            match = re.search(r'le="([^"]+)"', line)
            if match:
                buckets[match.group(1)] = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count"):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_sum"):
            total = float(line.rsplit(" ", 1)[1])
    return {"count": int(count), "mean_ms": round(total / count * 1000, 3) if count else None,
            "buckets": buckets,
            "p50_bucket_le_s": bucket_quantile(buckets, count, 0.50),
            "p99_bucket_le_s": bucket_quantile(buckets, count, 0.99)}


def bucket_quantile(buckets: dict[str, float], count: float, q: float) -> str | None:
    """The upper bound of the bucket holding the q-quantile."""
    if not count:
        return None
    for le, n in sorted(buckets.items(), key=lambda kv: float(kv[0])):
        if n >= q * count:
            return le
    return None


async def cancel_latency(url: str, store: RunStore, conn: AConn, log_dir: Path, *,
                         samples: int, timeout_s: float) -> dict[str, Any]:
    await conn.execute("TRUNCATE agent_runs CASCADE")
    port = free_port()
    with worker_fleet(url, log_dir) as fleet:
        worker = WorkerProc(url, "cancel", {"agent": "bench.agents:sleeper", "concurrency": 4,
                                            "reaper": False, "metrics_port": port,
                                            "metrics_host": "127.0.0.1"}, log_dir)
        fleet.append(worker.start())
        await until("listener session", lambda: fetch_one(
            conn, "SELECT 1 AS ok FROM pg_stat_activity WHERE datname = current_database()"
                  " AND application_name = 'runlease-listen'"), 60,
            interval_s=0.05, alive=worker.check_alive)
        latencies: list[float] = []
        from_call: list[float] = []
        call_ms: list[float] = []
        deadline = time.monotonic() + timeout_s
        for _ in range(samples):
            run_id = (await store.enqueue("default", "bench", {"seconds": 60})).run.id
            await until("run leased", partial(has_status, conn, run_id, "leased"), 30,
                        interval_s=0.002, alive=worker.check_alive)
            await asyncio.sleep(0.02)  # the agent is in ctx.sleep by now
            before = time.perf_counter()
            run = await store.request_cancel(run_id)
            after = time.perf_counter()
            if str(run.status) != "cancelled":
                await until("run cancelled", partial(has_status, conn, run_id, "cancelled"),
                            30, interval_s=0.001, alive=worker.check_alive)
            done = time.perf_counter()
            latencies.append((done - after) * 1000)
            from_call.append((done - before) * 1000)
            call_ms.append((after - before) * 1000)
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(random.uniform(0.02, 0.05))
        try:
            histogram: dict[str, Any] = scrape_histogram(port, "runlease_cancel_latency_seconds")
        except OSError as exc:
            histogram = {"error": str(exc)}
        worker.stop(grace_s=10)
    return {
        "cancelled_after_request_returned_ms": percentiles(latencies),
        "cancelled_after_request_called_ms": percentiles(from_call),
        "request_cancel_call_ms": percentiles(call_ms),
        "worker_histogram": histogram,
    }


async def has_status(conn: AConn, run_id: UUID, wanted: str) -> bool:
    row = await fetch_one(conn, "SELECT status FROM agent_runs WHERE id = %s", (run_id,))
    return row is not None and row["status"] == wanted


# --------------------------------------------------------------------------
# (c) kill -9 -> resumed elsewhere
# --------------------------------------------------------------------------


async def kill_recovery(url: str, store: RunStore, conn: AConn, log_dir: Path, rep: int,
                        timeout_s: float) -> dict[str, Any]:
    common = {"agent": "bench.agents:sleeper", "concurrency": 1, "lease_s": KILL_LEASE_S,
              "heartbeat_interval_s": KILL_HEARTBEAT_S}
    with worker_fleet(url, log_dir) as fleet:
        a = WorkerProc(url, f"kill-a{rep}", {**common, "reaper": False}, log_dir)
        fleet.append(a.start())
        run_id = (await store.enqueue("default", "bench", {"seconds": 600})).run.id
        held_sql = ("SELECT status, lease_epoch, locked_by, locked_until, attempts"
                    " FROM agent_runs WHERE id = %s")

        async def held_by(worker: WorkerProc) -> dict[str, Any] | None:
            row = await fetch_one(conn, held_sql, (run_id,))
            if row and row["status"] == "leased" and \
                    str(row["locked_by"]).startswith(worker.identity_prefix):
                return row
            return None

        first = await until("run leased by A", lambda: held_by(a), 60, interval_s=0.01,
                            alive=a.check_alive)
        # B starts only now, so that it cannot take the run first.
        b = WorkerProc(url, f"kill-b{rep}", {**common, "reaper": True,
                                             "reaper_interval_s": KILL_REAPER_INTERVAL_S},
                       log_dir)
        fleet.append(b.start())
        await until("B elected reaper leader", lambda: fetch_one(
            conn, "SELECT 1 AS ok FROM runlease_leaders WHERE name = 'reaper'"
                  " AND leader_id LIKE %s AND expires_at > now()", (b.identity_prefix + "%",)),
            60, interval_s=0.02, alive=b.check_alive)
        # Kill at a random phase of A's heartbeat.
        await asyncio.sleep(random.uniform(0.0, KILL_HEARTBEAT_S))
        a.check_alive()
        a.kill9()
        killed = time.perf_counter()
        # A is dead: its lease's end is final now (no more renewals).
        row = await fetch_one(conn, "SELECT clock_timestamp() AS ts, locked_until"
                                    " FROM agent_runs WHERE id = %s", (run_id,))
        assert row is not None
        killed_db, lease_end = row["ts"].timestamp(), row["locked_until"].timestamp()
        resumed = await until("run resumed by B", lambda: held_by(b), timeout_s,
                              interval_s=0.01, alive=b.check_alive)
        recovery_s = time.perf_counter() - killed
        cur = await conn.execute(
            "SELECT created_at FROM agent_run_events WHERE run_id = %s"
            " AND kind = 'run.lease_expired' ORDER BY seq DESC LIMIT 1", (run_id,))
        reap = await cur.fetchone()
        await store.request_cancel(run_id)
        b.stop(grace_s=10)  # resigns leadership for the next repetition
    # The server's own instants: the old lease's end, the reap, B's claim
    # (B's claim set locked_until = claim time + lease_s; no renewal yet).
    claimed_at = resumed["locked_until"].timestamp() - KILL_LEASE_S
    reaped_at = reap["created_at"].timestamp() if reap else None
    return {
        "rep": rep,
        "recovery_s": round(recovery_s, 3),
        "epoch": [first["lease_epoch"], resumed["lease_epoch"]],
        "attempt": resumed["attempts"],
        "lease_left_at_kill_s": round(lease_end - killed_db, 3),
        "reaped_after_lease_end_s": round(reaped_at - lease_end, 3) if reaped_at else None,
        "claimed_after_reap_ms": round((claimed_at - reaped_at) * 1000, 1) if reaped_at else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--database-url")
    parser.add_argument("--start-samples", type=int, default=200)
    parser.add_argument("--poll-samples", type=int, default=50,
                        help="samples of the --no-listen (polling) start latency, spaced "
                             f"{POLL_SPACING_S[0]:g}-{POLL_SPACING_S[1]:g} s apart so that "
                             "they fall at random phases of the poll")
    parser.add_argument("--start-concurrency", type=int, default=4)
    parser.add_argument("--cancel-samples", type=int, default=100)
    parser.add_argument("--kill-repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=120, help="seconds per phase wait")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures: dict[str, Any] = {"machine": machine(), "embedded": not args.database_url}
    log_dir = Path(tempfile.mkdtemp(prefix="runlease-bench-latency-"))
    figures["worker_logs"] = str(log_dir)
    with terminate_as_interrupt(), server(args.database_url) as base_url:
        url = fresh_database(base_url, "runlease_bench_latency")
        asyncio.run(measure_all(url, args, log_dir, figures))
    if args.json:
        emit_json(figures)
    else:
        print_report(figures)


async def measure_all(url: str, args: argparse.Namespace, log_dir: Path,
                      figures: dict[str, Any]) -> None:
    async with make_pool(url, min_size=1, max_size=2) as pool, \
            await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                  row_factory=dict_row) as conn:
        store = RunStore(pool)
        row = await fetch_one(conn, "SHOW server_version")
        figures["server"] = row["server_version"] if row else "?"
        with phase("(a) start latency, NOTIFY"):
            figures["start_notify"] = await start_latency(
                url, store, conn, log_dir, listen=True, samples=args.start_samples,
                concurrency=args.start_concurrency, spacing_s=(0.02, 0.05),
                timeout_s=args.timeout)
        with phase("(a) start latency, polling only"):
            figures["start_poll"] = await start_latency(
                url, store, conn, log_dir, listen=False, samples=args.poll_samples,
                concurrency=args.start_concurrency, spacing_s=POLL_SPACING_S,
                timeout_s=args.timeout)
        with phase("(b) cancel latency"):
            figures["cancel"] = await cancel_latency(url, store, conn, log_dir,
                                                     samples=args.cancel_samples,
                                                     timeout_s=args.timeout)
        reps = []
        with phase(f"(c) kill -9 recovery x{args.kill_repeats}"):
            for rep in range(args.kill_repeats):
                reps.append(await kill_recovery(url, store, conn, log_dir, rep,
                                                timeout_s=max(30.0, 3 * TARGET_RECOVERY_S)))
        figures["kill_recovery"] = {
            "lease_s": KILL_LEASE_S, "heartbeat_interval_s": KILL_HEARTBEAT_S,
            "reaper_interval_s": KILL_REAPER_INTERVAL_S, "target_s": TARGET_RECOVERY_S,
            "recovery_s": percentiles([r["recovery_s"] for r in reps]), "reps": reps,
        }
    figures["targets"] = targets(figures)


def targets(f: dict[str, Any]) -> dict[str, Any]:
    start = f["start_notify"]["start_after_enqueue_returned_ms"]
    cancel = f["cancel"]["cancelled_after_request_returned_ms"]
    recovery = f["kill_recovery"]["recovery_s"]

    def check(value: float | None, limit: float) -> dict[str, Any]:
        return {"value": value, "target": limit,
                "met": None if value is None else value <= limit}

    return {
        "start_p50_ms_notify": check(start["p50"], TARGET_START_P50_MS),
        "start_p99_ms_notify": check(start["p99"], TARGET_START_P99_MS),
        "cancel_p99_ms": check(cancel["p99"], TARGET_CANCEL_P99_MS),
        "recovery_max_s": check(recovery["max"], TARGET_RECOVERY_S),
    }


def print_report(f: dict[str, Any]) -> None:
    print(f"\nlatencies, PostgreSQL {f['server']} "
          f"({'durable embedded' if f['embedded'] else 'given URL'}), "
          f"{f['machine']['cpus']} CPUs\n")

    def row(name: str, p: dict[str, Any], unit: str, target: str) -> list[Any]:
        def fmt(x: float | None) -> str:
            return "" if x is None else f"{x:.1f}" if unit == "ms" else f"{x:.2f}"
        return [name, p["n"], fmt(p["p50"]), fmt(p["p99"]), fmt(p["max"]), unit, target]

    sn, sp, c = f["start_notify"], f["start_poll"], f["cancel"]
    k = f["kill_recovery"]
    print_table(["measure", "n", "p50", "p99", "max", "unit", "target"], [
        row(f"enqueue -> agent start, NOTIFY (c={sn['concurrency']})",
            sn["start_after_enqueue_returned_ms"], "ms",
            f"p50 < {TARGET_START_P50_MS:g}, p99 < {TARGET_START_P99_MS:g}"),
        row("  same, from the enqueue call", sn["start_after_enqueue_called_ms"], "ms", ""),
        row("  enqueue call itself", sn["enqueue_call_ms"], "ms", ""),
        row(f"enqueue -> agent start, polling only (c={sp['concurrency']})",
            sp["start_after_enqueue_returned_ms"], "ms", "(poll interval 2 s +-25%)"),
        row("cancel -> status cancelled", c["cancelled_after_request_returned_ms"], "ms",
            f"p99 < {TARGET_CANCEL_P99_MS:g}"),
        row("  same, from the request_cancel call", c["cancelled_after_request_called_ms"],
            "ms", ""),
        row("  request_cancel call itself", c["request_cancel_call_ms"], "ms", ""),
        row(f"kill -9 -> resumed on B (lease {k['lease_s']} s, "
            f"reaper {k['reaper_interval_s']:g} s)",
            k["recovery_s"], "s", f"<= {k['target_s']:g}"),
    ])
    h = c["worker_histogram"]
    if "error" in h:
        print(f"\nworker's runlease_cancel_latency_seconds: unavailable ({h['error']})")
    else:
        print(f"\nworker's runlease_cancel_latency_seconds: n={h['count']}, "
              f"mean {h['mean_ms']} ms, p50 <= {h['p50_bucket_le_s']} s, "
              f"p99 <= {h['p99_bucket_le_s']} s (bucket bounds)")
    print("\nkill -9 repetitions:")
    print_table(["rep", "recovery s", "lease left at kill s", "reaped after lease end s",
                 "claimed after reap ms", "epoch", "attempt"],
                [[r["rep"], r["recovery_s"], r["lease_left_at_kill_s"],
                  r["reaped_after_lease_end_s"], r["claimed_after_reap_ms"],
                  " -> ".join(map(str, r["epoch"])), r["attempt"]] for r in k["reps"]])
    print("\ntargets (not asserted):")
    for name, t in f["targets"].items():
        verdict = "n/a" if t["met"] is None else "met" if t["met"] else "NOT met"
        print(f"  {name}: {t['value']} vs {t['target']:g} -> {verdict}")
    print("(noisy shared machine: indicative only)")


if __name__ == "__main__":
    main()
