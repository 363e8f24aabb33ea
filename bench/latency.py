"""Latencies of real `runlease worker` processes: start, cancel, crash recovery,
capped-tenant wake-up, cancel at start.

    python bench/latency.py [--database-url URL] [--skip PHASES] [--json]

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
(d) capped tenant: slot freed -> next run started, p50/p99. Pool `capped`
    with the tenant limit acme=1; one idle worker (4 slots, agent
    `bench.agents:stamp`, default poll interval 2 s). Each repetition the
    bench itself holds acme's one slot (it enqueues a run and claims it
    through the store in one transaction, then enqueues a second acme run,
    which stays pending: capped), waits a moment, acks its lease, and times
    from the ack returning until the second run's agent started. A finished
    run NOTIFYs a pool with tenant limits, so the listening worker claims at
    once; the same is measured with --no-listen (polling only: what a
    listening worker waited before finishing runs notified).
(e) cancel at start: a cooperative agent `bench.agents:marked_sleeper`
    (leaves a file the moment it starts, then ctx.sleep(60)); one idle
    listening worker on pool `gated` (a tenant limit that is never reached).
    Each run is enqueued and request_cancel raced against the worker's claim
    and start, three ways: as soon as the run is seen leased (status polled
    every ~1 ms); at a random instant 0-2 ms after enqueue returned (some
    find the run still pending: counted, not sampled); and committed right
    after the claim (the bench holds the tenant lock runlease_claim takes
    once it has locked the run's row, sends the cancel, which waits for that
    row, then lets the claim go). Measured for the runs leased at the
    request: request_cancel returned -> 'cancelled', p50/p99; how many
    agents started at all; how long after the claim each cancel was
    requested (server clocks: lease start vs cancel_requested_at); how many
    took >= 1 s. A cancel whose NOTIFY reaches the worker before the run's
    start is applied at start; before that it waited for the next heartbeat
    (15 s by default).

Any phase can be left out with --skip (start, poll, cancel, kill, capped,
early-cancel); (d) and (e) stop sampling once their time budget is spent
(--capped-budget per mode, --early-cancel-budget).

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
from benchlib import emit_json, fresh_database, incarnation, machine, print_table, server
from throughput import WorkerProc, terminate_as_interrupt, worker_fleet

from runlease.db.connect import make_conn_pool
from runlease.db.embedded import free_port
from runlease.db.models import Lease, Pool
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
CAPPED_POOL = "capped"
CAPPED_TENANT = "acme"
OUTSIDE_HOLDER = "bench-outside-holder"
EARLY_LEASE_S = 45
# Enqueue -> claim commit is a few ms with NOTIFY; cancels sent at random
# instants across that span land before, during and after the claim.
EARLY_DELAY_MS = (0.0, 2.0)
EARLY_POOL = "gated"
EARLY_TENANT = "gate"
EARLY_RACES = ("seen_leased", "after_enqueue", "in_claim")
# runlease_claim's tenant lock: pg_advisory_xact_lock(this, hashtext(pool/tenant)).
CLAIM_LOCK_CLASS = 1381322316
WAITERS_SQL = ("SELECT 1 AS ok FROM pg_stat_activity WHERE datname = current_database()"
               " AND wait_event_type = 'Lock'")
PHASES = ("start", "poll", "cancel", "kill", "capped", "early-cancel")
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
        # updated_at: the claim's instant while leased (a lease per worker,
        # migration 0015: nothing writes a leased run until its end).
        held_sql = ("SELECT status, lease_epoch, locked_by, updated_at, attempts"
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
        # A is dead: its lease's end is final now (no more renewals). A run's
        # lease is its holder's: A's incarnation's expires_at.
        row = await fetch_one(conn, "SELECT clock_timestamp() AS ts, w.expires_at"
                                    "  FROM agent_runs r"
                                    "  JOIN agent_run_workers w ON w.id = r.locked_by"
                                    " WHERE r.id = %s", (run_id,))
        assert row is not None
        killed_db, lease_end = row["ts"].timestamp(), row["expires_at"].timestamp()
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
    # (B's claim set updated_at; nothing writes the run while it runs).
    claimed_at = resumed["updated_at"].timestamp()
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


# --------------------------------------------------------------------------
# (d) capped tenant: slot freed -> next run started
# --------------------------------------------------------------------------


async def hold_capped_slot(store: RunStore, holder: str, i: int) -> tuple[Lease, UUID]:
    """The bench takes acme's one slot itself (enqueue + claim in one
    transaction, so the worker never sees that run pending) and queues a
    second acme run behind it, capped. Returns the held lease and that run."""
    async with store.connection() as c, c.transaction():
        held = await store.enqueue(CAPPED_POOL, CAPPED_TENANT, {"held": i}, conn=c)
        leases = await store.claim(CAPPED_POOL, holder, 1, conn=c)
        assert [x.run_id for x in leases] == [held.run.id], "the bench claimed another run"
        waiting = await store.enqueue(CAPPED_POOL, CAPPED_TENANT, {"i": i}, conn=c)
    return leases[0], waiting.run.id


async def capped_wakeup(url: str, store: RunStore, conn: AConn, log_dir: Path, *,
                        listen: bool, repeats: int, spacing_s: tuple[float, float],
                        budget_s: float, timeout_s: float) -> dict[str, Any]:
    await conn.execute("TRUNCATE agent_runs CASCADE")
    await store.upsert_pool(Pool(CAPPED_POOL))
    await store.set_tenant_limit(CAPPED_POOL, CAPPED_TENANT, 1)
    # The bench's own claims hold a lease: of an incarnation of its own.
    holder = await incarnation(store, OUTSIDE_HOLDER, CAPPED_POOL)
    name = "capped-notify" if listen else "capped-poll"
    with worker_fleet(url, log_dir) as fleet:
        worker = WorkerProc(url, name, {"agent": "bench.agents:stamp", "pool": CAPPED_POOL,
                                        "concurrency": 4, "listen": listen, "reaper": False},
                            log_dir)
        fleet.append(worker.start())
        if listen:
            await until("listener session", lambda: fetch_one(
                conn, "SELECT 1 AS ok FROM pg_stat_activity WHERE datname = current_database()"
                      " AND application_name = 'runlease-listen'"), 60,
                interval_s=0.05, alive=worker.check_alive)
        warm = await store.enqueue(CAPPED_POOL, CAPPED_TENANT, {"warmup": 0})
        await until("warm-up run", partial(has_status, conn, warm.run.id, "done"), 60,
                    interval_s=0.01, alive=worker.check_alive)
        await asyncio.sleep(0.5)
        latencies: list[float] = []
        from_call: list[float] = []
        ack_ms: list[float] = []
        not_capped = 0
        deadline = time.monotonic() + budget_s
        for i in range(repeats):
            held, waiting = await hold_capped_slot(store, holder, i)
            # The worker tries (NOTIFY of the enqueue) or polls, finds acme
            # at its cap and waits again.
            await asyncio.sleep(random.uniform(*spacing_s))
            if not await has_status(conn, waiting, "pending"):
                not_capped += 1  # the cap did not hold: not a sample
                await store.ack(held)
                continue
            before = time.time()
            await store.ack(held)
            after = time.time()
            await until("capped run done", partial(has_status, conn, waiting, "done"),
                        timeout_s, interval_s=0.005, alive=worker.check_alive)
            row = await fetch_one(conn, "SELECT result_json FROM agent_runs WHERE id = %s",
                                  (waiting,))
            assert row is not None
            started = float(row["result_json"]["started"])
            latencies.append((started - after) * 1000)
            from_call.append((started - before) * 1000)
            ack_ms.append((after - before) * 1000)
            if time.monotonic() > deadline:
                break
        worker.stop(grace_s=10)
    return {
        "mode": "notify" if listen else "poll only (--no-listen, poll_interval_s 2)",
        "pool": CAPPED_POOL, "tenant_limit": {CAPPED_TENANT: 1},
        "spacing_s": list(spacing_s),
        "start_after_ack_returned_ms": percentiles(latencies),
        "start_after_ack_called_ms": percentiles(from_call),
        "ack_call_ms": percentiles(ack_ms),
        "cap_not_holding": not_capped,
    }


# --------------------------------------------------------------------------
# (e) cancel between the claim's commit and the run's start
# --------------------------------------------------------------------------


async def first_lease(conn: AConn, run_id: UUID) -> float | None:
    """Poll the run every ~1 ms: the start of its lease (the claim's
    updated_at: runs carry no lease time since migration 0015) once it is
    seen leased, None if it ended before being seen so, or if the cancel
    request had written updated_at already when it was first seen leased
    (then the claim's instant is not known: no sample)."""
    while True:
        row = await fetch_one(conn, "SELECT status, updated_at, cancel_requested_at"
                                    " FROM agent_runs WHERE id = %s", (run_id,))
        if row is not None and row["status"] == "leased":
            if row["cancel_requested_at"] is not None:
                return None
            return float(row["updated_at"].timestamp())
        if row is None or row["status"] != "pending":
            return None
        await asyncio.sleep(0.001)


async def race_cancel(store: RunStore, conn: AConn, gate: AConn, worker: WorkerProc,
                      marks: Path, i: int, how: str, timeout_s: float) -> dict[str, Any]:
    """One run of the gated pool, cancelled racing the worker's claim and start:
    - seen_leased: as soon as its status is seen 'leased' (polled every ~1 ms);
    - after_enqueue: at a random instant EARLY_DELAY_MS after enqueue returned;
    - in_claim: while the worker's claim transaction holds the run's row:
      the bench holds the tenant's claim lock (the advisory lock
      runlease_claim takes after locking its candidates), sends the cancel,
      which waits for the run's row, and lets the claim go: the cancel
      commits right after the claim, as the run is being started."""
    if how == "in_claim":
        await gate.execute("SELECT pg_advisory_lock(%s, hashtext(%s))",
                           (CLAIM_LOCK_CLASS, f"{EARLY_POOL}/{EARLY_TENANT}"))
    run_id = (await store.enqueue(EARLY_POOL, EARLY_TENANT, {
        "seconds": 60, "mark_dir": str(marks), "i": i})).run.id
    watcher = None
    lease_start: float | None = None
    if how == "seen_leased":
        lease_start = await asyncio.wait_for(first_lease(conn, run_id), 30)
    elif how == "after_enqueue":
        watcher = asyncio.create_task(first_lease(conn, run_id))
        await asyncio.sleep(random.uniform(*EARLY_DELAY_MS) / 1000)
    elif how == "in_claim":
        await until("the worker's claim waiting on the tenant lock", lambda: fetch_one(
            conn, WAITERS_SQL + " HAVING count(*) FILTER (WHERE wait_event = 'advisory') > 0",
        ), 30, interval_s=0.001, alive=worker.check_alive)
    before = time.perf_counter()
    request = asyncio.create_task(store.request_cancel(run_id))
    if how == "in_claim":
        await until("the cancel waiting on the run's row", lambda: fetch_one(
            conn, WAITERS_SQL + " HAVING count(*) FILTER (WHERE wait_event <> 'advisory') > 0",
        ), 30, interval_s=0.001, alive=worker.check_alive)
        await gate.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))",
                           (CLAIM_LOCK_CLASS, f"{EARLY_POOL}/{EARLY_TENANT}"))
        watcher = asyncio.create_task(first_lease(conn, run_id))
    await request
    after = time.perf_counter()
    if watcher is not None:
        lease_start = await asyncio.wait_for(watcher, 30)
    await until("run cancelled", partial(has_status, conn, run_id, "cancelled"),
                timeout_s, interval_s=0.001, alive=worker.check_alive)
    done = time.perf_counter()
    row = await fetch_one(conn, "SELECT attempts, cancel_requested_at FROM agent_runs"
                                " WHERE id = %s", (run_id,))
    assert row is not None
    claimed = row["attempts"] > 0  # 0: the request found it pending (cancelled at once)
    requested = row["cancel_requested_at"]
    return {
        "claimed": claimed,
        # 'cancelled' is written once the agent's task has ended: its mark,
        # if it ever started, exists by now.
        "agent_started": (marks / str(run_id)).exists(),
        "latency_ms": (done - after) * 1000, "from_call_ms": (done - before) * 1000,
        "call_ms": (after - before) * 1000,
        "after_claim_ms": ((requested.timestamp() - lease_start) * 1000
                           if claimed and requested is not None and lease_start is not None
                           else None),
    }


async def early_cancel(url: str, store: RunStore, conn: AConn, log_dir: Path, *,
                       samples: int, budget_s: float, timeout_s: float) -> dict[str, Any]:
    await conn.execute("TRUNCATE agent_runs CASCADE")
    # A pool with a tenant limit (never reached): its claims take the
    # tenant's lock, which the in_claim race holds.
    await store.upsert_pool(Pool(EARLY_POOL))
    await store.set_tenant_limit(EARLY_POOL, EARLY_TENANT, 1000)
    marks = Path(tempfile.mkdtemp(prefix="marks-", dir=log_dir))
    out: dict[str, Any] = {"lease_s": EARLY_LEASE_S, "pool": EARLY_POOL}
    with worker_fleet(url, log_dir) as fleet:
        worker = WorkerProc(url, "early-cancel", {
            "agent": "bench.agents:marked_sleeper", "pool": EARLY_POOL, "concurrency": 4,
            "reaper": False, "lease_s": EARLY_LEASE_S}, log_dir)
        fleet.append(worker.start())
        await until("listener session", lambda: fetch_one(
            conn, "SELECT 1 AS ok FROM pg_stat_activity WHERE datname = current_database()"
                  " AND application_name = 'runlease-listen'"), 60,
            interval_s=0.05, alive=worker.check_alive)
        warm = await store.enqueue(EARLY_POOL, EARLY_TENANT,
                                   {"seconds": 0, "mark_dir": str(marks)})
        await until("warm-up run", partial(has_status, conn, warm.run.id, "done"), 60,
                    interval_s=0.01, alive=worker.check_alive)
        await asyncio.sleep(0.5)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as gate:
            for how in EARLY_RACES:
                records = []
                deadline = time.monotonic() + budget_s
                for i in range(samples):
                    records.append(await race_cancel(store, conn, gate, worker, marks, i, how,
                                                     timeout_s))
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(random.uniform(0.02, 0.05))
                out[how] = summarize_early(records, how)
        worker.stop(grace_s=10)
    return out


def summarize_early(records: list[dict[str, Any]], how: str) -> dict[str, Any]:
    leased = [r for r in records if r["claimed"]]

    def pct(rows: list[dict[str, Any]], key: str = "latency_ms") -> dict[str, Any]:
        return percentiles([r[key] for r in rows if r[key] is not None])

    return {
        "cancel_sent": {
            "seen_leased": "as soon as seen leased (status polled every ~1 ms)",
            "after_enqueue": f"{EARLY_DELAY_MS[0]:g}-{EARLY_DELAY_MS[1]:g} ms after enqueue",
            "in_claim": "while the claim held the run's row, committed right after it",
        }[how],
        "runs": len(records),
        "cancelled_while_pending": len(records) - len(leased),
        "leased_when_cancelled": len(leased),
        "agents_started": sum(r["agent_started"] for r in leased),
        "agents_never_started": sum(not r["agent_started"] for r in leased),
        "cancelled_after_request_returned_ms": pct(leased),
        "cancelled_after_request_called_ms": pct(leased, "from_call_ms"),
        "request_cancel_call_ms": pct(leased, "call_ms"),
        # Before a cancel that overtook the start was applied at start, such
        # a cancel waited for the worker's next heartbeat (15 s by default).
        "cancelled_after_1s_or_more": sum(r["latency_ms"] >= 1000 for r in leased),
        "cancelled_ms_agent_never_started": pct([r for r in leased if not r["agent_started"]]),
        "cancelled_ms_agent_started": pct([r for r in leased if r["agent_started"]]),
        "requested_after_claim_ms": pct(leased, "after_claim_ms"),
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
    parser.add_argument("--capped-repeats", type=int, default=20,
                        help="(d) repetitions, once with NOTIFY and once polling only")
    parser.add_argument("--capped-budget", type=float, default=35,
                        help="(d) seconds of sampling per mode at most")
    parser.add_argument("--early-cancel-samples", type=int, default=100,
                        help="(e) runs per way of racing the cancel")
    parser.add_argument("--early-cancel-budget", type=float, default=15,
                        help="(e) seconds of sampling per way of racing the cancel at most")
    parser.add_argument("--skip", default="", metavar="PHASES",
                        help="comma-separated phases not to run: " + ", ".join(PHASES))
    parser.add_argument("--timeout", type=float, default=120, help="seconds per phase wait")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.skip = {p.strip() for p in args.skip.split(",") if p.strip()}
    if unknown := args.skip - set(PHASES):
        parser.error(f"--skip: unknown phase(s) {', '.join(sorted(unknown))}; "
                     f"phases: {', '.join(PHASES)}")
    figures: dict[str, Any] = {"machine": machine(), "embedded": not args.database_url,
                               "skipped": sorted(args.skip)}
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
    async with make_conn_pool(url, min_size=1, max_size=2) as conn_pool, \
            await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                  row_factory=dict_row) as conn:
        store = RunStore(conn_pool)
        row = await fetch_one(conn, "SHOW server_version")
        figures["server"] = row["server_version"] if row else "?"
        if "start" not in args.skip:
            with phase("(a) start latency, NOTIFY"):
                figures["start_notify"] = await start_latency(
                    url, store, conn, log_dir, listen=True, samples=args.start_samples,
                    concurrency=args.start_concurrency, spacing_s=(0.02, 0.05),
                    timeout_s=args.timeout)
        if "poll" not in args.skip:
            with phase("(a) start latency, polling only"):
                figures["start_poll"] = await start_latency(
                    url, store, conn, log_dir, listen=False, samples=args.poll_samples,
                    concurrency=args.start_concurrency, spacing_s=POLL_SPACING_S,
                    timeout_s=args.timeout)
        if "cancel" not in args.skip:
            with phase("(b) cancel latency"):
                figures["cancel"] = await cancel_latency(url, store, conn, log_dir,
                                                         samples=args.cancel_samples,
                                                         timeout_s=args.timeout)
        if "kill" not in args.skip:
            reps = []
            with phase(f"(c) kill -9 recovery x{args.kill_repeats}"):
                for rep in range(args.kill_repeats):
                    reps.append(await kill_recovery(
                        url, store, conn, log_dir, rep,
                        timeout_s=max(30.0, 3 * TARGET_RECOVERY_S)))
            figures["kill_recovery"] = {
                "lease_s": KILL_LEASE_S, "heartbeat_interval_s": KILL_HEARTBEAT_S,
                "reaper_interval_s": KILL_REAPER_INTERVAL_S, "target_s": TARGET_RECOVERY_S,
                "recovery_s": percentiles([r["recovery_s"] for r in reps]), "reps": reps,
            }
        if "capped" not in args.skip:
            for listen, key, spacing in ((True, "capped_notify", (0.05, 0.15)),
                                         (False, "capped_poll", POLL_SPACING_S)):
                with phase(f"(d) capped tenant, {'NOTIFY' if listen else 'polling only'}"):
                    figures[key] = await capped_wakeup(
                        url, store, conn, log_dir, listen=listen, repeats=args.capped_repeats,
                        spacing_s=spacing, budget_s=args.capped_budget,
                        timeout_s=args.timeout)
        if "early-cancel" not in args.skip:
            with phase("(e) cancel at start"):
                figures["early_cancel"] = await early_cancel(
                    url, store, conn, log_dir, samples=args.early_cancel_samples,
                    budget_s=args.early_cancel_budget, timeout_s=args.timeout)
    figures["targets"] = targets(figures)


def targets(f: dict[str, Any]) -> dict[str, Any]:
    def check(value: float | None, limit: float) -> dict[str, Any]:
        return {"value": value, "target": limit,
                "met": None if value is None else value <= limit}

    out: dict[str, Any] = {}
    if "start_notify" in f:
        start = f["start_notify"]["start_after_enqueue_returned_ms"]
        out["start_p50_ms_notify"] = check(start["p50"], TARGET_START_P50_MS)
        out["start_p99_ms_notify"] = check(start["p99"], TARGET_START_P99_MS)
    if "cancel" in f:
        out["cancel_p99_ms"] = check(f["cancel"]["cancelled_after_request_returned_ms"]["p99"],
                                     TARGET_CANCEL_P99_MS)
    if "kill_recovery" in f:
        out["recovery_max_s"] = check(f["kill_recovery"]["recovery_s"]["max"],
                                      TARGET_RECOVERY_S)
    return out


def print_report(f: dict[str, Any]) -> None:
    print(f"\nlatencies, PostgreSQL {f['server']} "
          f"({'durable embedded' if f['embedded'] else 'given URL'}), "
          f"{f['machine']['cpus']} CPUs"
          + (f", skipped: {', '.join(f['skipped'])}" if f["skipped"] else "") + "\n")
    print_table(["measure", "n", "p50", "p99", "max", "unit", "target"], report_rows(f))
    print_details(f)
    print("(noisy shared machine: indicative only)")


def report_rows(f: dict[str, Any]) -> list[list[Any]]:
    def row(name: str, p: dict[str, Any], unit: str, target: str) -> list[Any]:
        def fmt(x: float | None) -> str:
            return "" if x is None else f"{x:.1f}" if unit == "ms" else f"{x:.2f}"
        return [name, p["n"], fmt(p["p50"]), fmt(p["p99"]), fmt(p["max"]), unit, target]

    rows: list[list[Any]] = []
    if "start_notify" in f:
        sn = f["start_notify"]
        rows += [
            row(f"enqueue -> agent start, NOTIFY (c={sn['concurrency']})",
                sn["start_after_enqueue_returned_ms"], "ms",
                f"p50 < {TARGET_START_P50_MS:g}, p99 < {TARGET_START_P99_MS:g}"),
            row("  same, from the enqueue call", sn["start_after_enqueue_called_ms"], "ms", ""),
            row("  enqueue call itself", sn["enqueue_call_ms"], "ms", ""),
        ]
    if "start_poll" in f:
        sp = f["start_poll"]
        rows.append(row(f"enqueue -> agent start, polling only (c={sp['concurrency']})",
                        sp["start_after_enqueue_returned_ms"], "ms", "(poll interval 2 s +-25%)"))
    if "cancel" in f:
        c = f["cancel"]
        rows += [
            row("cancel -> status cancelled", c["cancelled_after_request_returned_ms"], "ms",
                f"p99 < {TARGET_CANCEL_P99_MS:g}"),
            row("  same, from the request_cancel call", c["cancelled_after_request_called_ms"],
                "ms", ""),
            row("  request_cancel call itself", c["request_cancel_call_ms"], "ms", ""),
        ]
    if "kill_recovery" in f:
        k = f["kill_recovery"]
        rows.append(row(f"kill -9 -> resumed on B (lease {k['lease_s']} s, "
                        f"reaper {k['reaper_interval_s']:g} s)",
                        k["recovery_s"], "s", f"<= {k['target_s']:g}"))
    for key, label in (("capped_notify", "NOTIFY"), ("capped_poll", "polling only")):
        if key in f:
            d = f[key]
            rows.append(row(f"capped tenant: ack -> next run started, {label}",
                            d["start_after_ack_returned_ms"], "ms",
                            "(acme=1, slot held by the bench)"))
            rows.append(row("  ack call itself", d["ack_call_ms"], "ms", ""))
    for key, label in (("seen_leased", "as soon as seen leased"),
                       ("after_enqueue", "at random just after enqueue"),
                       ("in_claim", "committed right after the claim")):
        if key in f.get("early_cancel", {}):
            e = f["early_cancel"][key]
            rows += [
                row(f"cancel at start ({label}) -> cancelled",
                    e["cancelled_after_request_returned_ms"], "ms", "(runs leased at request)"),
                row("  agent never started", e["cancelled_ms_agent_never_started"], "ms", ""),
                row("  agent started", e["cancelled_ms_agent_started"], "ms", ""),
                row("  cancel requested after the claim (server)",
                    e["requested_after_claim_ms"], "ms", ""),
            ]
    return rows


def print_details(f: dict[str, Any]) -> None:
    for key in ("capped_notify", "capped_poll"):
        if f.get(key, {}).get("cap_not_holding"):
            print(f"\n{key}: the cap did not hold {f[key]['cap_not_holding']} time(s) "
                  "(second run claimed while the first was held)")
    for key, e in f.get("early_cancel", {}).items():
        if isinstance(e, dict):
            print(f"\ncancel at start, {key} ({e['cancel_sent']}): {e['runs']} runs, "
                  f"{e['cancelled_while_pending']} cancelled while still pending; of the "
                  f"{e['leased_when_cancelled']} leased, {e['agents_never_started']} agents "
                  f"never started, {e['agents_started']} started; "
                  f"{e['cancelled_after_1s_or_more']} took >= 1 s")
    if "cancel" in f:
        h = f["cancel"]["worker_histogram"]
        if "error" in h:
            print(f"\nworker's runlease_cancel_latency_seconds: unavailable ({h['error']})")
        else:
            print(f"\nworker's runlease_cancel_latency_seconds: n={h['count']}, "
                  f"mean {h['mean_ms']} ms, p50 <= {h['p50_bucket_le_s']} s, "
                  f"p99 <= {h['p99_bucket_le_s']} s (bucket bounds)")
    if "kill_recovery" in f:
        print("\nkill -9 repetitions:")
        print_table(["rep", "recovery s", "lease left at kill s", "reaped after lease end s",
                     "claimed after reap ms", "epoch", "attempt"],
                    [[r["rep"], r["recovery_s"], r["lease_left_at_kill_s"],
                      r["reaped_after_lease_end_s"], r["claimed_after_reap_ms"],
                      " -> ".join(map(str, r["epoch"])), r["attempt"]]
                     for r in f["kill_recovery"]["reps"]])
    if f["targets"]:
        print("\ntargets (not asserted):")
        for name, t in f["targets"].items():
            verdict = "n/a" if t["met"] is None else "met" if t["met"] else "NOT met"
            print(f"  {name}: {t['value']} vs {t['target']:g} -> {verdict}")


if __name__ == "__main__":
    main()
