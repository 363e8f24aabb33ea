"""The HTTP API under load: submit throughput (single and bulk), filtered
listing over a million runs, and SSE fan-out latency.

    python bench/api.py [--database-url URL] [--submits 3000] [--subscribers 100] [--json]
    python bench/api.py --quick --json    # the issue-15 targets only, under 3 minutes
                                          # (the list target over 250,000 runs)

- submit: `runlease api` in its own process; N POST /v1/runs from C
  concurrent keep-alive connections, runs/s and latency p50/p99. The load
  comes from a bare HTTP/1.1 client (prebuilt requests on asyncio streams):
  httpx would spend more CPU than the server on this 2-core machine.
- bulk: POST /v1/runs/batch with 1,000 runs a request from 4 connections,
  50 requests (--batches).
- Both print the CPU the API process and this client spent per run: the
  API's runs/s on this shared 2-core machine is its share of the cores over
  its CPU per run, so that figure says more than runs/s when the load moves.
- list: --list-runs runs (default 1,000,000) written straight into the
  tables (200 tenants, labels, mostly finished), then GET /v1/runs with one
  filter set after another, from 4 connections: latency p50/p99, and the CPU
  the load generator and the API process spent meanwhile (they share the
  machine's cores with PostgreSQL), with the load average before and after.
- The targets (issue 15), printed in `targets`: single submits >= 1,000
  runs/s at 32 clients, bulk >= 20,000 runs/s, list p99 < 50 ms.
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
import resource
import signal
import statistics
import subprocess
import sys
import time
import urllib.parse
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import emit_json, fresh_database, incarnation, machine, print_table, server

from runlease.db.connect import make_conn_pool
from runlease.db.embedded import free_port
from runlease.db.models import Pool
from runlease.db.store import RunStore

TOKEN = "bench-tenant-token-0123456789"


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of a process so far; None: this one."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_run(pid: int | None, before: tuple[float, float], runs: int) -> dict[str, float]:
    """The API's and this client's CPU per run since `before`: the API's
    throughput here is its share of two loaded cores over this figure."""
    if pid is None:
        return {}
    return {"api_cpu_us_per_run": round((cpu_s(pid) - before[0]) / runs * 1e6),
            "client_cpu_us_per_run": round((cpu_s() - before[1]) / runs * 1e6)}


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


class RawHttp:
    """One keep-alive HTTP/1.1 connection sending prebuilt requests."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
                f"Authorization: Bearer {TOKEN}\r\n")
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + (body or b""))
        headers = await self.reader.readuntil(b"\r\n\r\n")
        status = int(headers[9:12])
        length = 0
        for line in headers.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def submit_load(base: str, n: int, concurrency: int,
                      api_pid: int | None = None) -> dict[str, Any]:
    host, port = base.removeprefix("http://").split(":")
    latencies: list[float] = []
    next_i = iter(range(n))

    async def client() -> None:
        http = RawHttp(host, int(port))
        try:
            for i in next_i:
                t0 = time.perf_counter()
                status, body = await http.request("POST", "/v1/runs",
                                                  b'{"input": {"i": %d}}' % i)
                latencies.append(time.perf_counter() - t0)
                if status != 201:
                    raise SystemExit(f"submit failed: {status} {body[:200]!r}")
        finally:
            http.close()

    cpu0 = (cpu_s(api_pid) if api_pid else 0.0, cpu_s())
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {"runs": n, "concurrency": concurrency, "runs_per_s": n / elapsed,
            "p50_ms": pct(latencies, 0.5) * 1000, "p99_ms": pct(latencies, 0.99) * 1000,
            **cpu_per_run(api_pid, cpu0, n)}


async def bulk_load(base: str, batches: int, size: int = 1000,
                    concurrency: int = 4, api_pid: int | None = None) -> dict[str, Any]:
    host, port = base.removeprefix("http://").split(":")
    bodies = [json.dumps({"runs": [{"input": {"batch": b, "i": i},
                                    "labels": {"suite": "bench", "batch": str(b)}}
                                   for i in range(size)]}).encode() for b in range(batches)]
    latencies: list[float] = []
    todo = iter(bodies)

    async def client() -> None:
        http = RawHttp(host, int(port))
        try:
            for body in todo:
                t0 = time.perf_counter()
                status, answer = await http.request("POST", "/v1/runs/batch", body)
                latencies.append(time.perf_counter() - t0)
                if status != 201:
                    raise SystemExit(f"batch failed: {status} {answer[:200]!r}")
        finally:
            http.close()

    cpu0 = (cpu_s(api_pid) if api_pid else 0.0, cpu_s())
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {"runs": batches * size, "batch": size, "concurrency": concurrency,
            "runs_per_s": batches * size / elapsed, "p50_ms": pct(latencies, 0.5) * 1000,
            "p99_ms": pct(latencies, 0.99) * 1000, **cpu_per_run(api_pid, cpu0, batches * size)}


LIST_TENANTS = 200


def load_runs(url: str, n: int) -> float:
    """n runs of LIST_TENANTS tenants straight into the tables (bench, the
    tenant the load lists as, has a quarter of them), as enqueue leaves them:
    ids UUIDv7 over the last n seconds, the side tables written; the newest
    2% pending, the rest finished. Returns the seconds it took."""
    started = time.perf_counter()
    step = 200_000
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            conn.execute(f"""
                WITH made AS (
                    SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint
                                        - {n} * 1000 + g * 1000), 12, '0')
                            || '7' || lpad(to_hex(g % 4096), 3, '0') || '8'
                            || lpad(to_hex(g), 15, '0'))::uuid AS id,
                           CASE WHEN g % 4 = 0 THEN 'bench'
                                ELSE 'tenant-' || (g % {LIST_TENANTS}) END AS tenant_id, g
                      FROM generate_series({lo + 1}, {hi}) g
                ), ins AS (
                    INSERT INTO agent_runs (id, tenant_id, status, input_json, finished_at,
                                            labels, created_at, updated_at, attempts,
                                            error_code)
                    SELECT id, tenant_id, status, jsonb_build_object('i', g),
                           CASE WHEN status <> 'pending'
                                THEN now() - make_interval(secs => {n} - g - 1) END,
                           jsonb_build_object('team', 'team-' || (g / {LIST_TENANTS}) % 20,
                                              'case', (g % 1000)::text),
                           now() - make_interval(secs => {n} - g),
                           now() - make_interval(secs => {n} - g - 1), 1,
                           CASE WHEN status = 'dead' THEN 'agent_error' END
                      FROM (SELECT made.*,
                                   CASE WHEN g > {n} * 0.98 THEN 'pending'
                                        ELSE (ARRAY['done', 'done', 'done', 'dead',
                                                    'cancelled'])[1 + g % 5] END AS status
                              FROM made) made
                    RETURNING id, tenant_id, labels
                ), t AS (
                    INSERT INTO agent_run_tenant_index SELECT tenant_id, id FROM ins
                )
                INSERT INTO agent_run_labels
                SELECT ins.tenant_id, l.key, l.value, ins.id
                  FROM ins CROSS JOIN LATERAL jsonb_each_text(ins.labels) l""")
        conn.execute("VACUUM ANALYZE agent_runs, agent_run_tenant_index, agent_run_labels")
    return time.perf_counter() - started


def list_queries(n: int) -> list[tuple[str, str]]:
    mid = datetime.now(UTC) - timedelta(seconds=n // 2)
    q = urllib.parse.quote
    return [
        ("newest", "/v1/runs?limit=50"),
        ("status", "/v1/runs?status=dead&limit=50"),
        ("statuses", "/v1/runs?status=pending&status=leased&limit=50"),
        ("label", "/v1/runs?label=team:team-3&limit=50"),
        ("labels", "/v1/runs?label=team:team-3&label=case:200&limit=50"),
        ("label+status", "/v1/runs?label=team:team-7&status=cancelled&limit=50"),
        ("created range", f"/v1/runs?created_after={q(mid.isoformat())}"
                          f"&created_before={q((mid + timedelta(hours=1)).isoformat())}"),
        ("finished before", f"/v1/runs?finished_before={q(mid.isoformat())}&limit=50"),
        ("pool+status", "/v1/runs?pool=default&status=done&limit=50"),
        ("key", "/v1/runs?idempotency_key=nope&limit=50"),
    ]


async def list_load(base: str, n: int, rounds: int, concurrency: int = 4) -> dict[str, Any]:
    host, port = base.removeprefix("http://").split(":")
    queries = list_queries(n)
    by_name: dict[str, list[float]] = {name: [] for name, _ in queries}
    todo = iter([q for _ in range(rounds) for q in queries])
    pages = 0

    async def client() -> None:
        nonlocal pages
        http = RawHttp(host, int(port))
        try:
            for name, path in todo:
                t0 = time.perf_counter()
                status, body = await http.request("GET", path)
                by_name[name].append(time.perf_counter() - t0)
                if status != 200:
                    raise SystemExit(f"list failed: {path} {status} {body[:200]!r}")
                # And the next page, through the cursor.
                cursor = json.loads(body).get("next_cursor")
                if cursor:
                    t0 = time.perf_counter()
                    status, body = await http.request("GET", f"{path}&cursor={cursor}")
                    by_name[name].append(time.perf_counter() - t0)
                    pages += 1
        finally:
            http.close()

    # What the load itself costs this machine (the client shares its 2 cores
    # with the API and PostgreSQL): this process's CPU over the same span.
    load_before, cpu_before, started = os.getloadavg()[0], time.process_time(), \
        time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    everything = [x for v in by_name.values() for x in v]
    return {"runs": n, "requests": len(everything), "concurrency": concurrency,
            "p50_ms": pct(everything, 0.5) * 1000, "p99_ms": pct(everything, 0.99) * 1000,
            "by_filter_p99_ms": {k: pct(v, 0.99) * 1000 for k, v in by_name.items()},
            "wall_s": wall, "client_cpu_s": time.process_time() - cpu_before,
            "load_avg": [load_before, os.getloadavg()[0]]}


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def fan_out(base: str, url: str, subscribers: int, events: int,
                  rate_per_s: float) -> dict[str, Any]:
    async with make_conn_pool(url, max_size=2) as conn_pool:
        store = RunStore(conn_pool)
        # A pool of its own: the submit load left many runs in "default".
        await store.upsert_pool(Pool("fanout"))
        queued = await store.enqueue("fanout", "bench", {"busy": True})
        writer = await incarnation(store, "bench-writer", "fanout", lease_s=600)
        (lease,) = await store.claim("fanout", writer, 1)
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
        figures: dict[str, Any] = {"machine": machine()}
        try:
            await wait_ready(base)
            await submit_load(base, 500, 32)  # warm: connections, prepared statements
            concurrencies = (32,) if args.quick else (1, 8, 32)
            figures["submit"] = [await submit_load(base, args.submits, c, api.pid)
                                 for c in concurrencies]
            figures["bulk"] = await bulk_load(base, args.batches, api_pid=api.pid)
            figures["load_average"] = os.getloadavg()
            if not args.quick:
                figures["fan_out"] = await fan_out(base, url, args.subscribers, args.events,
                                                   args.rate)
            figures["list_load_s"] = load_runs(url, args.list_runs)
            api_cpu = process_cpu_s(api.pid)
            figures["list"] = await list_load(base, args.list_runs, args.list_rounds)
            if api_cpu is not None:
                figures["list"]["api_cpu_s"] = (process_cpu_s(api.pid) or 0) - api_cpu
        finally:
            os.killpg(api.pid, signal.SIGTERM)
            try:
                api.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(api.pid, signal.SIGKILL)
    at32 = next(s for s in figures["submit"] if s["concurrency"] == 32)
    figures["targets"] = [
        target("single submits/s per API process, 32 clients", at32["runs_per_s"], 1000, ">="),
        target("bulk submits/s per API process, batches of 1,000", figures["bulk"]["runs_per_s"],
               20_000, ">="),
        target(f"list with filters over {args.list_runs:,} runs, p99 ms",
               figures["list"]["p99_ms"], 50, "<"),
    ]
    return figures


def target(name: str, value: float, goal: float, op: str) -> dict[str, Any]:
    met = value >= goal if op == ">=" else value < goal
    return {"name": name, "value": round(value, 1), "target": f"{op} {goal:g}", "met": met}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url")
    parser.add_argument("--quick", action="store_true",
                        help="only the targets, 32 clients, no fan-out (under 3 minutes)")
    parser.add_argument("--submits", type=int, default=None)
    parser.add_argument("--batches", type=int, default=None, help="of 1,000 runs")
    parser.add_argument("--list-runs", type=int, default=None,
                        help="runs in the table the list target reads (default 1,000,000; "
                             "--quick: 250,000, loading a million takes minutes here)")
    parser.add_argument("--list-rounds", type=int, default=None)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0, help="events per second")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.submits = args.submits or (5000 if args.quick else 10_000)
    # 50 batches in --quick too: 20 (one second at the target) measured the
    # first requests' warm-up and one stall of the neighbours as much as the
    # rate (16,000-22,000 runs/s on a quiet machine, 20,700-25,700 with 50).
    args.batches = args.batches or 50
    args.list_rounds = args.list_rounds or (30 if args.quick else 100)
    args.list_runs = args.list_runs or (250_000 if args.quick else 1_000_000)
    figures = asyncio.run(run(args))
    if args.json:
        emit_json(figures)
        return
    print("\nsubmit: POST /v1/runs through `runlease api` (one process), durable PostgreSQL\n")
    print_table(["connections", "runs/s", "p50 ms", "p99 ms", "API CPU us/run",
                 "client CPU us/run"],
                [[s["concurrency"], s["runs_per_s"], s["p50_ms"], s["p99_ms"],
                  s["api_cpu_us_per_run"], s["client_cpu_us_per_run"]]
                 for s in figures["submit"]])
    bulk = figures["bulk"]
    print(f"\nbulk: POST /v1/runs/batch, {bulk['batch']} runs a request, "
          f"{bulk['concurrency']} connections\n")
    print_table(["runs", "runs/s", "p50 ms", "p99 ms", "API CPU us/run", "client CPU us/run"],
                [[bulk["runs"], bulk["runs_per_s"], bulk["p50_ms"], bulk["p99_ms"],
                  bulk["api_cpu_us_per_run"], bulk["client_cpu_us_per_run"]]])
    listing = figures["list"]
    print(f"\nlist: GET /v1/runs with filters over {listing['runs']:,} runs "
          f"(loaded in {figures['list_load_s']:.0f} s), {listing['concurrency']} connections\n")
    print_table(["filter", "p99 ms"], [[k, v] for k, v in listing["by_filter_p99_ms"].items()]
                + [["all", listing["p99_ms"]]])
    print(f"CPU over the list load's {listing['wall_s']:.1f} s: the load generator "
          f"{listing['client_cpu_s']:.1f} s, the API process "
          f"{listing.get('api_cpu_s', float('nan')):.1f} s; load average "
          f"{listing['load_avg'][0]:.1f} -> {listing['load_avg'][1]:.1f}")
    if "fan_out" in figures:
        fan = figures["fan_out"]
        print(f"\nSSE fan-out: {fan['subscribers']} subscribers on one run, {fan['events']} "
              f"events at {fan['rate_per_s']:g}/s\n")
        print_table(["deliveries", "p50 ms", "p99 ms", "mean ms"],
                    [[fan["deliveries"], fan["p50_ms"], fan["p99_ms"], fan["mean_ms"]]])
    print()
    for t in figures["targets"]:
        print(f"{'met' if t['met'] else 'NOT met'}: {t['name']}: {t['value']:g} "
              f"(target {t['target']})")


if __name__ == "__main__":
    main()
