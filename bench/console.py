"""The web console's pages against a large table: what a viewer's poll costs.

    python bench/console.py [--database-url URL] [--runs 200000] [--tenants 20] [--json]

Fills agent_runs with N finished and pending runs over T tenants (in one
INSERT ... SELECT per batch, through the store's enqueue_many), serves the
API in this process, signs in as a tenant and as admin, then times each page
(median and p99 of 50 requests, one at a time): the runs page, its live
fragment (polled every 3 s by each open page), filtered by one status and
by two, a run's page (with its timeline), the usage page, pools.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
from benchlib import emit_json, fresh_database, print_table, server

from runlease.db.connect import make_conn_pool
from runlease.db.store import NewRun, RunStore
from tests.support.api import ADMIN_TOKEN, TOKENS, serve_api

REQUESTS = 50


async def fill(url: str, runs: int, tenants: int) -> None:
    names = ["acme", "globex"] + [f"tenant-{i}" for i in range(tenants - 2)]
    async with make_conn_pool(url, max_size=2) as pool:
        store = RunStore(pool)
        batch = 5000
        for start in range(0, runs, batch):
            await store.enqueue_many("default", [
                NewRun(names[i % len(names)], {"i": i, "prompt": "x" * 200})
                for i in range(start, min(runs, start + batch))])
    with psycopg.connect(url, autocommit=True) as conn:
        # Most runs of a large table are finished: mark 90 % done.
        conn.execute("UPDATE agent_runs SET status = 'done', finished_at = now() "
                     "WHERE ('x' || substr(md5(id::text), 1, 2))::bit(8)::int < 230")
    async with make_conn_pool(url, max_size=2) as pool:
        # The counts' deltas folded, as the reaper's leader does every pass
        # (the bench runs no reaper).
        await RunStore(pool).fold_counts()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


async def time_page(http: httpx.AsyncClient, path: str) -> dict[str, Any]:
    spent = []
    for _ in range(REQUESTS):
        t0 = time.perf_counter()
        r = await http.get(path)
        spent.append(time.perf_counter() - t0)
        assert r.status_code == 200, (path, r.status_code)
    spent.sort()
    return {"p50_ms": round(statistics.median(spent) * 1000, 1),
            "p99_ms": round(spent[min(len(spent) - 1, int(0.99 * len(spent)))] * 1000, 1)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"runs": args.runs, "tenants": args.tenants}
    with server(args.database_url) as base:
        url = fresh_database(base, "runlease_bench_console")
        t0 = time.perf_counter()
        await fill(url, args.runs, args.tenants)
        figures["fill_s"] = round(time.perf_counter() - t0, 1)
        async with serve_api(url) as api:
            any_run = None
            for who, token in (("tenant", TOKENS["acme"]), ("admin", ADMIN_TOKEN)):
                async with httpx.AsyncClient(base_url=api.url, timeout=60) as http:
                    r = await http.post("/ui/login", data={"token": token})
                    assert r.status_code == 303
                    if any_run is None:
                        page = await http.get("/ui/runs")
                        any_run = page.text.split('data-run="', 1)[1].split('"', 1)[0]
                    for name, path in (("runs page", "/ui/runs"),
                                       ("live fragment", "/ui/runs/table"),
                                       ("filtered: pending", "/ui/runs/table?status=pending"),
                                       ("filtered: dead or cancelled",
                                        "/ui/runs/table?status=dead&status=cancelled"),
                                       ("usage, 14 days", "/ui/usage"),
                                       ("a run's page", f"/ui/runs/{any_run}"),
                                       *([("pools", "/ui/pools")] if who == "admin" else [])):
                        figures[f"{who}: {name}"] = await time_page(http, path)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url")
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    if args.json:
        emit_json(figures)
        return
    print(f"{figures['runs']} runs over {figures['tenants']} tenants "
          f"(filled in {figures['fill_s']} s); {REQUESTS} requests each, one at a time")
    print_table(["page", "p50 ms", "p99 ms"],
                [(k, v["p50_ms"], v["p99_ms"]) for k, v in figures.items()
                 if isinstance(v, dict)])


if __name__ == "__main__":
    main()
