"""The HTTP API under load: submit throughput, and SSE fan-out latency.

    python bench/api.py [--database-url URL] [--submits 3000] [--subscribers 100] [--json]

- submit: `runlease api` in its own process; N POST /v1/runs from C
  concurrent keep-alive connections (httpx), runs/s and latency p50/p99.
- fan-out: S subscribers follow one busy run's event stream while a writer
  (holding the run's lease, as a worker would) records E events at a steady
  rate; delivery latency = when a subscriber read the event - when it was
  stored (both this machine's clock), p50/p99 over every (event, subscriber).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import emit_json, fresh_database, print_table, server

from runlease.db.connect import make_conn_pool
from runlease.db.embedded import free_port
from runlease.db.models import Pool
from runlease.db.store import RunStore

TOKEN = "bench-tenant-token-0123456789"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def start_api(url: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RUNLEASE_DATABASE_URL": url, "RUNLEASE_PORT": str(port),
           "RUNLEASE_TOKENS": f"bench={TOKEN}", "RUNLEASE_LOG_LEVEL": "WARNING"}
    return subprocess.Popen([sys.executable, "-m", "runlease", "api"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


async def wait_ready(base: str) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(200):
            try:
                if (await http.get(f"{base}/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
    raise SystemExit("the API did not become ready")


async def submit_load(base: str, n: int, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30,
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n):
            queue.put_nowait(i)

        async def client() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                t0 = time.perf_counter()
                r = await http.post("/v1/runs", json={"input": {"i": i}})
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 201:
                    raise SystemExit(f"submit failed: {r.status_code} {r.text[:200]}")

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"runs": n, "concurrency": concurrency, "runs_per_s": n / elapsed,
            "p50_ms": pct(latencies, 0.5) * 1000, "p99_ms": pct(latencies, 0.99) * 1000}


async def fan_out(base: str, url: str, subscribers: int, events: int,
                  rate_per_s: float) -> dict[str, Any]:
    async with make_conn_pool(url, max_size=2) as conn_pool:
        store = RunStore(conn_pool)
        # A pool of its own: the submit load left many runs in "default".
        await store.upsert_pool(Pool("fanout"))
        queued = await store.enqueue("fanout", "bench", {"busy": True})
        (lease,) = await store.claim("fanout", "bench-writer", 1, lease_s=600)
        assert lease.run_id == queued.run.id
        latencies: list[float] = []
        connected = 0
        all_connected = asyncio.Event()

        async def subscriber() -> None:
            nonlocal connected
            async with httpx.AsyncClient(base_url=base, timeout=120,
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
                    http.stream("GET", f"/v1/runs/{queued.run.id}/events") as r:
                connected += 1
                if connected == subscribers:
                    all_connected.set()
                seen = 0
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and '"seq"' in line:
                        now = time.time()
                        stamp = datetime.fromisoformat(json.loads(line[6:])["created_at"])
                        latencies.append(now - stamp.timestamp())
                        seen += 1
                        if seen == events:
                            return

        tasks = [asyncio.create_task(subscriber()) for _ in range(subscribers)]
        await asyncio.wait_for(all_connected.wait(), 60)
        await asyncio.sleep(0.5)  # every stream is past its replay
        for i in range(events):
            await store.record_event(lease, "message.delta", {"text": f"token {i}"})
            await asyncio.sleep(1 / rate_per_s)
        _, pending = await asyncio.wait(tasks, timeout=30)
        if pending:
            raise SystemExit(f"{len(pending)} subscribers did not see all {events} events; "
                             f"deliveries {len(latencies)}")
        await store.ack(lease)
    return {"subscribers": subscribers, "events": events, "rate_per_s": rate_per_s,
            "deliveries": len(latencies), "p50_ms": pct(latencies, 0.5) * 1000,
            "p99_ms": pct(latencies, 0.99) * 1000,
            "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan")}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with server(args.database_url) as base_url:
        url = fresh_database(base_url, "runlease_bench_api")
        port = free_port()
        api = start_api(url, port)
        base = f"http://127.0.0.1:{port}"
        try:
            await wait_ready(base)
            submits = [await submit_load(base, args.submits, c) for c in (1, 8, 32)]
            fan = await fan_out(base, url, args.subscribers, args.events, args.rate)
        finally:
            os.killpg(api.pid, signal.SIGTERM)
            try:
                api.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(api.pid, signal.SIGKILL)
        return {"submit": submits, "fan_out": fan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url")
    parser.add_argument("--submits", type=int, default=3000)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0, help="events per second")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    if args.json:
        emit_json(figures)
        return
    print("\nsubmit: POST /v1/runs through `runlease api` (one process), durable PostgreSQL\n")
    print_table(["connections", "runs/s", "p50 ms", "p99 ms"],
                [[s["concurrency"], s["runs_per_s"], s["p50_ms"], s["p99_ms"]]
                 for s in figures["submit"]])
    fan = figures["fan_out"]
    print(f"\nSSE fan-out: {fan['subscribers']} subscribers on one run, {fan['events']} events "
          f"at {fan['rate_per_s']:g}/s\n")
    print_table(["deliveries", "p50 ms", "p99 ms", "mean ms"],
                [[fan["deliveries"], fan["p50_ms"], fan["p99_ms"], fan["mean_ms"]]])


if __name__ == "__main__":
    main()
