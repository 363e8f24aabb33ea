"""Streams by the thousand on one API process (issue 16, target 4).

    python bench/scale_streams.py [--database-url URL] [--quick] [--json]
                                  [--streams 1000] [--rate 200]

`runlease api` runs in its own process. The bench opens --streams event
streams (one per leased run, plain HTTP/1.1 on asyncio sockets, so the
client costs little CPU beside the API on a 2-core machine) and measures:

- feed connections: the API's sessions in pg_stat_activity named
  runlease-api-listen and runlease-api-feed (the fan-out's LISTEN session and
  its reader), with every stream open; and its pooled ones (runlease-api);
- idle cost: the fan-out's statements (runlease_sse_feed_reads_total) and
  the transactions committed on the database per second, and the API
  process's CPU, while every stream is open and no event is written (after
  12 s of quiet: PostgreSQL may report a backend's commits 10 s late);
- memory: the API's RSS before the streams and with them open, and the
  difference per stream;
- delivery: a writer holding the runs' leases records --rate events/s, each
  on a random run, for a while; latency = when the client read the event -
  its created_at (one machine, one clock), p50/p99 over every event;
- submit: p99 of POST /v1/runs (4 concurrent clients) before the streams,
  with them open, and after they closed (the machine's noise, measured).

Without --database-url an embedded PostgreSQL is started (fsync off unless
--durable). Figures are printed; nothing here asserts a speed. `measure()`
and `targets()` are what bench/scale.py calls for its target 4.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import emit_json, fresh_database, incarnation, machine, print_table, server

from runlease.db.connect import make_conn_pool
from runlease.db.embedded import free_port
from runlease.db.models import Lease, Pool
from runlease.db.store import NewRun, RunStore

TOKEN = "bench-streams-token-0123456789"
POOL = "streams"
FEED_APP_NAMES = ("runlease-api-listen", "runlease-api-feed")
TICK = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def start_api(url: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RUNLEASE_DATABASE_URL": url, "RUNLEASE_PORT": str(port),
           "RUNLEASE_TOKENS": f"bench={TOKEN}", "RUNLEASE_LOG_LEVEL": "WARNING",
           "RUNLEASE_SSE_MAX_STREAMS_PER_TENANT": "100000"}
    return subprocess.Popen([sys.executable, "-m", "runlease", "api"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop_api(api: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(api.pid, signal.SIGTERM)
    try:
        api.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(api.pid, signal.SIGKILL)
        api.wait(10)


async def wait_ready(base: str) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(400):
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{base}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.05)
    raise SystemExit("the API did not become ready")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def sessions(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'runlease-api%%'"
            " GROUP BY 1").fetchall()
    return {str(name): int(n) for name, n in rows}


async def feed_reads(base: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{base}/metrics")).text
    for line in text.splitlines():
        if line.startswith("runlease_sse_feed_reads_total "):
            return float(line.split()[1])
    return float("nan")


def commits(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database"
                           " WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


async def submit_p99(base: str, n: int, concurrency: int = 4) -> float:
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=60,
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        left = iter(range(n))

        async def client() -> None:
            for i in left:
                t0 = time.perf_counter()
                r = await http.post("/v1/runs", json={"pool": "default", "input": {"i": i}})
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 201:
                    raise SystemExit(f"submit failed: {r.status_code} {r.text[:200]}")

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return pct(latencies, 0.99) * 1000


class Streams:
    """Event streams read with plain asyncio sockets: the bench's side stays cheap."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.opened = 0
        self.latencies: list[float] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.failed: list[str] = []
        self.expected = 0  # deliveries to wait for
        self.arrived = asyncio.Event()

    async def open(self, run_ids: list[UUID], at_once: int = 100) -> None:
        gate = asyncio.Semaphore(at_once)
        started = [asyncio.Event() for _ in run_ids]

        async def one(run_id: UUID, ready: asyncio.Event) -> None:
            async with gate:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: bench\r\n"
                             f"Authorization: Bearer {TOKEN}\r\n"
                             "Accept: text/event-stream\r\n\r\n".encode())
                status = await reader.readline()
                if b" 200 " not in status:
                    self.failed.append(status.decode(errors="replace").strip())
                    ready.set()
                    return
                while (await reader.readline()).strip():
                    pass  # headers
                # The body is chunked; each chunk holds whole SSE lines, so
                # the chunk-size lines are skipped along with the rest.
                while not (await reader.readline()).startswith(b"retry:"):
                    pass
                self.opened += 1
                ready.set()
            try:
                while line := await reader.readline():
                    if line.startswith(b"data: ") and b'"seq"' in line:
                        stamp = json.loads(line[6:])["created_at"]
                        self.latencies.append(time.time()
                                              - datetime.fromisoformat(stamp).timestamp())
                        if len(self.latencies) >= self.expected:
                            self.arrived.set()
            finally:
                writer.close()

        self.tasks = [asyncio.create_task(one(r, e)) for r, e in zip(run_ids, started,
                                                                     strict=True)]
        for event in started:
            await event.wait()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def leased_runs(store: RunStore, n: int) -> list[Lease]:
    await store.upsert_pool(Pool(POOL))
    for start in range(0, n, 500):
        await store.enqueue_many(POOL, [NewRun("bench", {"i": i})
                                        for i in range(start, min(n, start + 500))])
    leases: list[Lease] = []
    writer = await incarnation(store, "bench-writer", POOL)
    while len(leases) < n:
        leases += await store.claim(POOL, writer, min(1000, n - len(leases)))
    return leases


async def write_events(store: RunStore, leases: list[Lease], rate: float,
                       seconds: float) -> int:
    n = int(rate * seconds)
    rng = random.Random(16)
    tasks: list[asyncio.Task[int]] = []
    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        lease = rng.choice(leases)
        tasks.append(asyncio.create_task(
            store.record_event(lease, "message.delta", {"text": f"token {i}"})))
    await asyncio.gather(*tasks)
    return n


async def _measure(url: str, *, streams: int, rate: float, quick: bool) -> dict[str, Any]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    api = start_api(url, port)
    submits = 200 if quick else 1000
    idle_s = 5.0 if quick else 15.0
    write_s = 10.0 if quick else 30.0
    try:
        await wait_ready(base)
        await submit_p99(base, 50)  # warm up: pool connections, prepared statements
        without = await submit_p99(base, submits)
        rss_before = rss_mib(api.pid)
        async with make_conn_pool(url, max_size=8) as pool:
            store = RunStore(pool)
            leases = await leased_runs(store, streams)
            client = Streams(port)
            try:
                t0 = time.perf_counter()
                await client.open([lease.run_id for lease in leases])
                open_s = time.perf_counter() - t0
                if client.failed:
                    raise SystemExit(f"{len(client.failed)} streams refused: "
                                     f"{client.failed[0]}")
                await asyncio.sleep(12)  # past every replay, and the stats' report delay
                held = sessions(url)
                r0, c0 = await feed_reads(base), commits(url)
                cpu0, w0 = cpu_s(api.pid), time.perf_counter()
                await asyncio.sleep(idle_s)
                cpu1, w1 = cpu_s(api.pid), time.perf_counter()
                r1, c1 = await feed_reads(base), commits(url)
                rss_streams = rss_mib(api.pid)
                with_streams = await submit_p99(base, submits)
                client.expected = int(rate * write_s)
                cpu2, w2 = cpu_s(api.pid), time.perf_counter()
                written = await write_events(store, leases, rate, write_s)
                cpu3, w3 = cpu_s(api.pid), time.perf_counter()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(client.arrived.wait(), 30)
                held_busy = sessions(url)
            finally:
                await client.close()
        await asyncio.sleep(2)  # the streams' ends reach the API
        again = await submit_p99(base, submits)  # the machine's noise, once more
    finally:
        stop_api(api)
    feed = max(sum(held.get(n, 0) for n in FEED_APP_NAMES),
               sum(held_busy.get(n, 0) for n in FEED_APP_NAMES))
    lat = client.latencies
    return {
        "streams": streams, "opened": client.opened, "open_s": open_s, "idle_s": idle_s,
        "feed_connections": feed, "api_sessions_idle": held, "api_sessions_busy": held_busy,
        # None on a build without the fan-out (the figures before it).
        "idle_feed_reads": None if r1 != r1 else int(r1 - r0),
        # One of these is the bench's own read of the counter; the LISTEN
        # session's liveness probe is one per 5 s.
        "idle_commits_per_s": (c1 - c0 - 1) / (w1 - w0),
        "idle_api_cpu_pct": 100 * (cpu1 - cpu0) / (w1 - w0),
        "rss_before_mib": rss_before, "rss_streams_mib": rss_streams,
        "kib_per_idle_stream": (rss_streams - rss_before) * 1024 / streams,
        "rate_per_s": rate, "events": written, "delivered": len(lat),
        "busy_api_cpu_pct": 100 * (cpu3 - cpu2) / (w3 - w2),
        "delivery_p50_ms": pct(lat, 0.5) * 1000, "delivery_p99_ms": pct(lat, 0.99) * 1000,
        "delivery_max_ms": max(lat, default=float("nan")) * 1000,
        "submit_p99_ms_without": without, "submit_p99_ms_with": with_streams,
        "submit_p99_ms_after": again,
    }


def measure(url: str, quick: bool = False, *, streams: int = 1000,
            rate: float = 200.0) -> dict[str, Any]:
    """Target 4's figures, on a fresh database of the server at `url`."""
    db = fresh_database(url, "runlease_bench_streams")
    return asyncio.run(_measure(db, streams=streams, rate=rate, quick=quick))


def targets(f: dict[str, Any]) -> list[dict[str, Any]]:
    """Target 4 as {name, value, target, met} items (bench/scale.py's table)."""
    def item(name: str, value: Any, target: str, met: bool | None) -> dict[str, Any]:
        return {"name": name, "value": value, "target": target, "met": met}

    n = f"{f['streams']:,}"
    complete = f["delivered"] >= f["events"]
    without, with_ = f["submit_p99_ms_without"], f["submit_p99_ms_with"]
    after = f.get("submit_p99_ms_after", without)
    return [
        item(f"4. feed connections with {n} streams", f["feed_connections"], "<= 5",
             f["feed_connections"] <= 5),
        item(f"4. event delivery p99 ms, {f['rate_per_s']:g} events/s over {n} streams"
             f" ({f['delivered']:,}/{f['events']:,} delivered)",
             round(f["delivery_p99_ms"], 1), "< 100", complete and f["delivery_p99_ms"] < 100),
        item(f"4. fan-out reads while {n} streams idle {f['idle_s']:g} s"
             f" (transactions/s: {f['idle_commits_per_s']:.2f})", f["idle_feed_reads"],
             "0 (an idle stream makes no query)", f["idle_feed_reads"] == 0
             and f["idle_commits_per_s"] < 1),
        item(f"4. submit p99 ms with {n} streams (without: before, after)",
             f"{with_:.1f} ({without:.1f}, {after:.1f})", "about the same (< 2x + 10 ms)",
             with_ < 2 * max(without, after) + 10),
        item(f"4. memory per idle stream KiB (API RSS {f['rss_streams_mib']:.0f} MiB with {n})",
             round(f["kib_per_idle_stream"], 1), "reported", None),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url")
    ap.add_argument("--quick", action="store_true", help="shorter phases (about a minute)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--durable", action="store_true", help="fsync on (as in production)")
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=200.0, help="events per second")
    args = ap.parse_args()
    with server(args.database_url, durable=args.durable) as url:
        figures = measure(url, args.quick, streams=args.streams, rate=args.rate)
    result = {"quick": args.quick, "durable": args.durable, "machine": machine(),
              "date": time.strftime("%Y-%m-%d"), "streams": figures,
              "targets": targets(figures)}
    if args.json:
        emit_json(result)
        return
    f = figures
    print(f"{f['opened']:,} streams opened in {f['open_s']:.1f} s; API sessions idle "
          f"{f['api_sessions_idle']}, busy {f['api_sessions_busy']}")
    print(f"idle {f['idle_s']:g} s: {f['idle_feed_reads']} fan-out reads, "
          f"{f['idle_commits_per_s']:.2f} transactions/s, API CPU "
          f"{f['idle_api_cpu_pct']:.1f}% of a core; RSS {f['rss_before_mib']:.0f} -> "
          f"{f['rss_streams_mib']:.0f} MiB")
    print(f"delivery at {f['rate_per_s']:g}/s: p50 {f['delivery_p50_ms']:.1f} ms, p99 "
          f"{f['delivery_p99_ms']:.1f} ms, max {f['delivery_max_ms']:.1f} ms; API CPU "
          f"{f['busy_api_cpu_pct']:.0f}% of a core\n")
    print_table(["target", "value", "goal", "met"],
                [[t["name"], t["value"], t["target"], "-" if t["met"] is None else str(t["met"])]
                 for t in result["targets"]])


if __name__ == "__main__":
    main()
