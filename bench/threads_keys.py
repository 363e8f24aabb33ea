"""Threads and concurrency keys at scale (issue 27's targets)

    python bench/threads_keys.py [--database-url URL] [--quick] [--json]

Target 27.1, claim flat behind blocked runs: an uncapped tenant's claim+ack
rate (bench/scale.py's claim_rate: one connection, claim 1 then ack) on an
empty pool, then on a pool with 100,000 runs queued behind 1,000 busy
threads (each head leased by a live worker, 50 runs parked behind it) and
1,000 concurrency keys at their limit of 1 (one run holding each slot, 50
parked), loaded as a submit parks them (tests/support/blocked.py). Twice
each, alternated, the best of each kept; the figure is rate(blocked) /
rate(empty), target >= 0.7. Beside it, the rows of agent_runs one claim of
10 reads in each database (EXPLAIN ANALYZE; what
tests/integration/test_thread_plans.py asserts).

Target 27.2, submit to a thread: p99 of POST /v1/runs into a thread (100
threads in turn, so most submits park behind a busy head) against a plain
submit, 4 concurrent clients, through a real `runlease api` process;
alternated twice, the best p99 of each kept. Target: thread p99 <= 2x plain.
A submit with a concurrency key is measured beside them (no target).

--quick: 1,000 claims per rate and 200 submits per p99 (else 2,000 and
1,000). Without --database-url an embedded PostgreSQL is started, fsync off
unless --durable. Figures are printed; nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from benchlib import emit_json, fresh_database, incarnation, machine, print_table, server
from scale import claim_rate, item
from scale_streams import TOKEN, pct, start_api, stop_api, wait_ready

from runlease.db.connect import make_conn_pool
from runlease.db.embedded import free_port
from runlease.db.store import NewRun, RunStore
from tests.support.blocked import load_blocked
from tests.support.plans import executed, reads

THREADS = 1000
KEYS = 1000
PER = 50


def claim_reads(url: str, pool: str) -> int:
    """Rows of agent_runs one claim of 10 reads (rolled back), in a fresh session."""
    async def go() -> int:
        async with make_conn_pool(url, min_size=1, max_size=2) as conn_pool:
            store = RunStore(conn_pool)
            await store.enqueue_many(pool, [NewRun(f"probe-{i % 5}", {}) for i in range(20)])
            worker = await incarnation(store, "probe", pool)
            _, found = await executed(store, lambda c: store.claim(pool, worker, 10, conn=c))
            async with store.connection() as conn:  # leave the pool as it was
                await conn.execute("DELETE FROM agent_runs WHERE tenant_id LIKE 'probe-%%'"
                                   " AND pool = %s", (pool,))
            return sum(reads(e.plan) for e in found)

    return asyncio.run(go())


def claim_figures(url: str, quick: bool) -> dict[str, Any]:
    runs = 1_000 if quick else 2_000
    empty_db = fresh_database(url, "keyed_empty")
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("INSERT INTO agent_run_pools (name) VALUES ('work')")
        # The same key limits as the blocked pool's, so the same paths run.
        conn.execute("INSERT INTO agent_run_key_limits (pool, key, max_in_flight)"
                     " VALUES ('work', 'key-*', 1)")
    db = fresh_database(url, "keyed_blocked")
    t0 = time.perf_counter()
    blocked = load_blocked(db, "work", threads=THREADS, keys=KEYS, per=PER)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE agent_runs")
    load_s = time.perf_counter() - t0
    reads_empty, reads_blocked = claim_reads(empty_db, "work"), claim_reads(db, "work")
    empties, backlogs = [], []
    for _ in range(2):
        empties.append(claim_rate(empty_db, "work", runs))
        backlogs.append(claim_rate(db, "work", runs))
    empty = max(r["rate"] for r in empties)
    backlog = max(r["rate"] for r in backlogs)
    return {"blocked_runs": blocked, "busy_threads": THREADS, "full_keys": KEYS,
            "claimed": runs, "load_s": load_s, "empty_rate": empty, "blocked_rate": backlog,
            "ratio": backlog / empty, "claim_rows_read_empty": reads_empty,
            "claim_rows_read_blocked": reads_blocked,
            "rates_empty": [r["rate"] for r in empties],
            "rates_blocked": [r["rate"] for r in backlogs]}


async def submit_p99(base: str, n: int, extra: Any, concurrency: int = 4) -> float:
    """p99 ms of n submits; `extra(i)`: the fields added to submit i."""
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=60,
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        left = iter(range(n))

        async def client() -> None:
            for i in left:
                body = {"pool": "default", "input": {"i": i}, **extra(i)}
                t0 = time.perf_counter()
                r = await http.post("/v1/runs", json=body)
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 201:
                    raise SystemExit(f"submit failed: {r.status_code} {r.text[:200]}")

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return pct(latencies, 0.99) * 1000


def submit_figures(url: str, quick: bool) -> dict[str, Any]:
    n = 200 if quick else 1000
    db = fresh_database(url, "keyed_submits")
    kinds = {"plain": lambda i: {},
             "thread": lambda i: {"thread_id": f"conv-{i % 100}"},
             "key": lambda i: {"concurrency_key": f"user-{i % 100}"}}

    async def go() -> dict[str, list[float]]:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        api = start_api(db, port)
        try:
            await wait_ready(base)
            for extra in kinds.values():  # warm up: connections, prepared statements
                await submit_p99(base, 50, extra)
            seen: dict[str, list[float]] = {k: [] for k in kinds}
            for _ in range(2):
                for kind, extra in kinds.items():
                    seen[kind].append(await submit_p99(base, n, extra))
            return seen
        finally:
            stop_api(api)

    seen = asyncio.run(go())
    best = {k: min(v) for k, v in seen.items()}
    return {"submits": n, "concurrency": 4, "p99_ms": best, "p99_ms_each": seen,
            "thread_over_plain": best["thread"] / best["plain"],
            "key_over_plain": best["key"] / best["plain"]}


def measure(url: str, quick: bool = False) -> dict[str, Any]:
    return {"claim": claim_figures(url, quick), "submit": submit_figures(url, quick)}


def targets(f: dict[str, Any]) -> list[dict[str, Any]]:
    c, s = f["claim"], f["submit"]
    return [
        item(f"27.1 claim behind {c['blocked_runs']:,} blocked runs ({c['busy_threads']:,} busy"
             f" threads, {c['full_keys']:,} full keys) / empty (rows read per claim of 10:"
             f" {c['claim_rows_read_blocked']} vs {c['claim_rows_read_empty']})",
             round(c["ratio"], 3), ">= 0.7", c["ratio"] >= 0.7),
        item(f"27.2 submit to a thread p99 / plain submit p99 ({s['p99_ms']['thread']:.1f} vs"
             f" {s['p99_ms']['plain']:.1f} ms)",
             round(s["thread_over_plain"], 2), "<= 2", s["thread_over_plain"] <= 2),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--durable", action="store_true", help="fsync on (as in production)")
    args = ap.parse_args()
    with server(args.database_url, durable=args.durable) as url:
        f = measure(url, args.quick)
    items = targets(f)
    if args.json:
        emit_json({"quick": args.quick, "durable": args.durable, "machine": machine(),
                   "date": time.strftime("%Y-%m-%d"), **f, "targets": items})
        return
    c, s = f["claim"], f["submit"]
    print(f"claim+ack, one connection, {c['claimed']:,} runs of a fresh tenant:")
    print_table(["queue", "claims/s", "each run", "rows read / claim of 10"], [
        ["empty", c["empty_rate"], " ".join(f"{r:.0f}" for r in c["rates_empty"]),
         c["claim_rows_read_empty"]],
        [f"{c['blocked_runs']:,} blocked ({c['busy_threads']:,} busy threads,"
         f" {c['full_keys']:,} full keys)", c["blocked_rate"],
         " ".join(f"{r:.0f}" for r in c["rates_blocked"]), c["claim_rows_read_blocked"]]])
    print(f"\nPOST /v1/runs p99 ms, {s['submits']} submits, {s['concurrency']} clients"
          " (best of 2; each run in brackets):")
    print_table(["submit", "p99 ms", "each", "over plain"], [
        [kind, ms, " ".join(f"{v:.1f}" for v in s["p99_ms_each"][kind]),
         ms / s["p99_ms"]["plain"]] for kind, ms in s["p99_ms"].items()])
    print()
    print_table(["target", "value", "goal", "met"],
                [[t["name"], t["value"], t["target"], str(t["met"])] for t in items])


if __name__ == "__main__":
    main()
