"""Memory over time (issue 16, target 6): does a busy worker or API grow?

    python bench/soak.py [--database-url URL] [--quick] [--minutes 10] [--json]

One `runlease worker` process (concurrency --runs, the agent
`bench.agents:sleeper`) holds --runs (1,000) runs in flight, each sleeping
longer than the soak; one `runlease api` process serves --streams (1,000)
idle SSE streams (GET /v1/runs/{id}/events of those runs, opened by raw
sockets from this process, read to the end). Once every run is leased and
every stream open, a warm-up passes, then both processes' RSS (VmRSS) is
sampled every --every seconds for --minutes (default 10; --quick: 2).

Printed: each process's RSS when idle (before the load), at the start and
the end of the soak, its peak, the memory per in-flight run or open stream
((start - idle) / n), and its growth per minute (least-squares slope over the
samples), with a pass/fail line: growth over the soak within noise
(max(NOISE_MIB, NOISE_FRACTION of the start RSS)). `targets(figures)` gives
the same as target dicts for bench/scale.py. Runs still leased and streams
still open at the end are counted too: a pass with the load gone is no pass.

Bounded: every child is killed at exit (Ctrl-C or SIGTERM included); the
whole run takes setup + warm-up + --minutes. Without --database-url an
embedded PostgreSQL is started (fsync off: what is measured is memory).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import emit_json, fresh_database, machine, print_table, server
from throughput import WorkerProc, terminate_as_interrupt

from runlease.db.connect import make_conn_pool
from runlease.db.embedded import free_port
from runlease.db.store import NewRun, RunStore

ROOT = Path(__file__).resolve().parents[1]
TENANT, TOKEN = "soak", "soak-tenant-token-0123456789"
# Growth over the soak within this is noise: allocator arenas, the GC's
# generations, a few late-imported modules.
NOISE_MIB = 4.0
NOISE_FRACTION = 0.03


# -- processes -------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@contextlib.contextmanager
def api_process(url: str, log_dir: Path, streams: int) -> Iterator[tuple[subprocess.Popen[bytes],
                                                                        int]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLEASE_")}
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT),
                                                  os.environ.get("PYTHONPATH", "")) if p),
        "RUNLEASE_DATABASE_URL": url, "RUNLEASE_PORT": str(port),
        "RUNLEASE_TOKENS": f"{TENANT}={TOKEN}", "RUNLEASE_LOG_LEVEL": "WARNING",
        # One tenant holds every stream here: its cap must not refuse them.
        "RUNLEASE_SSE_MAX_STREAMS_PER_TENANT": str(max(streams, 200)),
    })
    with (log_dir / "api.log").open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "runlease", "api"], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc, port
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def wait_until(what: str, probe: Any, timeout_s: float, alive: list[Any]) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        for check in alive:
            check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def api_alive(proc: subprocess.Popen[bytes], log_dir: Path) -> None:
    if proc.poll() is not None:
        raise RuntimeError(f"the API exited ({proc.returncode}):\n"
                           + (log_dir / "api.log").read_text(errors="replace")[-3000:])


def api_ready(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def enqueue(url: str, runs: int, seconds: float) -> list[UUID]:
    async def go() -> list[UUID]:
        async with make_conn_pool(url, max_size=1) as pool:
            store = RunStore(pool)
            ids: list[UUID] = []
            for start in range(0, runs, 500):
                queued = await store.enqueue_many("default", [
                    NewRun(TENANT, {"seconds": seconds}) for _ in range(start,
                                                                        min(runs, start + 500))])
                ids += [q.run.id for q in queued]
            return ids

    return asyncio.run(go())


def scalar(url: str, query: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
        assert row is not None
        return row[0]


# -- streams ---------------------------------------------------------------------------


class Streams:
    """`n` idle SSE streams on raw sockets, in a thread of their own with its
    own event loop (this process's main thread samples and sleeps)."""

    def __init__(self, port: int, run_ids: list[UUID]) -> None:
        self.port = port
        self.run_ids = run_ids
        self.open = 0
        self.refused: list[str] = []
        self.ended = 0
        self.bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    async def _one(self, run_id: UUID) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError as exc:
            self.refused.append(f"connect: {exc}")
            return
        try:
            writer.write((f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: soak\r\n"
                          f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n"
                          "\r\n").encode())
            await writer.drain()
            status = await reader.readline()
            if b" 200 " not in status:
                self.refused.append(status.decode(errors="replace").strip())
                return
            self.open += 1
            try:
                while chunk := await reader.read(65536):
                    self.bytes += len(chunk)
            finally:
                self.open -= 1
            self.ended += 1
        except (OSError, asyncio.IncompleteReadError) as exc:
            self.refused.append(f"{type(exc).__name__}: {exc}")
        finally:
            writer.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        tasks = []
        for run_id in self.run_ids:  # paced: a burst of 1,000 connects is its own test
            tasks.append(asyncio.create_task(self._one(run_id)))
            await asyncio.sleep(0.002)
        await self._stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)


# -- figures ---------------------------------------------------------------------------


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB), in MiB per minute."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mr = sum(r for _, r in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    cov = sum((t - mt) * (r - mr) for t, r in samples)
    return cov / var * 60 if var else 0.0


def summarize(name: str, idle: float, samples: list[tuple[float, float]], n: int,
              soak_min: float) -> dict[str, Any]:
    rss = [r for _, r in samples]
    growth = slope_per_minute(samples)
    noise = max(NOISE_MIB, NOISE_FRACTION * rss[0])
    return {
        "name": name, "idle_mib": round(idle, 1), "start_mib": round(rss[0], 1),
        "end_mib": round(rss[-1], 1), "peak_mib": round(max(rss), 1),
        "per_item_kib": round((rss[0] - idle) * 1024 / n, 1) if n else None,
        "growth_mib_per_min": round(growth, 3),
        "growth_over_soak_mib": round(growth * soak_min, 2),
        "noise_mib": round(noise, 1),
        "passed": growth * soak_min <= noise,
        "samples": [(round(t, 1), round(r, 2)) for t, r in samples],
    }


def measure(base_url: str | None, *, quick: bool = False, minutes: float | None = None,
            runs: int = 1000, streams: int = 1000, every_s: float | None = None,
            warmup_s: float | None = None, note: Any = None) -> dict[str, Any]:
    """Run the soak on a server (None: an embedded one); the figures."""
    soak_min = minutes if minutes is not None else (2.0 if quick else 10.0)
    every = every_s or (10.0 if quick else 15.0)
    warmup = warmup_s if warmup_s is not None else (15.0 if quick else 30.0)
    say = note or (lambda text: print(text, file=sys.stderr, flush=True))
    log_dir = Path(tempfile.mkdtemp(prefix="runlease-bench-soak-"))
    with server(base_url, durable=False) as server_url:
        url = fresh_database(server_url, "runlease_bench_soak")
        sleep_s = warmup + soak_min * 60 + 600  # in flight past the end
        with api_process(url, log_dir, streams) as (api, port):
            worker = WorkerProc(url, "soak", {"agent": "bench.agents:sleeper",
                                              "concurrency": runs}, log_dir).start()
            try:
                checks = [worker.check_alive, lambda: api_alive(api, log_dir)]
                wait_until("the API", lambda: api_ready(port), 60, checks)
                assert worker.proc is not None
                time.sleep(3)  # the worker imported and connected
                idle = {"worker": rss_mib(worker.proc.pid), "api": rss_mib(api.pid)}
                ids = enqueue(url, runs, sleep_s)
                wait_until(f"{runs} runs in flight", lambda: scalar(
                    url, "SELECT count(*) FROM agent_runs WHERE status = 'leased'") >= runs,
                    120, checks)
                say(f"soak: {runs} runs in flight")
                feed = Streams(port, ids[:streams])
                import threading

                thread = threading.Thread(target=feed.run, name="streams", daemon=True)
                thread.start()
                try:
                    wait_until(f"{streams} streams open",
                               lambda: feed.open + len(feed.refused) >= streams, 120, checks)
                    say(f"soak: {feed.open} streams open ({len(feed.refused)} refused); "
                        f"warm-up {warmup:.0f} s, then {soak_min:g} min")
                    time.sleep(warmup)
                    t0 = time.monotonic()
                    worker_s: list[tuple[float, float]] = []
                    api_s: list[tuple[float, float]] = []
                    while True:
                        for check in checks:
                            check()
                        t = time.monotonic() - t0
                        worker_s.append((t, rss_mib(worker.proc.pid)))
                        api_s.append((t, rss_mib(api.pid)))
                        if t >= soak_min * 60:
                            break
                        time.sleep(min(every, soak_min * 60 - t))
                    leased = scalar(url, "SELECT count(*) FROM agent_runs "
                                         "WHERE status = 'leased'")
                    still_open = feed.open
                finally:
                    feed.stop()
                    thread.join(10)
            finally:
                worker.kill()
    w = summarize("worker", idle["worker"], worker_s, runs, soak_min)
    a = summarize("api", idle["api"], api_s, streams, soak_min)
    w["in_flight_at_end"], a["open_at_end"] = leased, still_open
    w["passed"] = w["passed"] and leased >= runs
    a["passed"] = a["passed"] and still_open >= streams
    return {"runs": runs, "streams": streams, "soak_min": soak_min, "warmup_s": warmup,
            "every_s": every, "refused_streams": feed.refused[:5], "worker": w, "api": a,
            "machine": machine(), "logs": str(log_dir)}


def targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Target 6 as bench/scale.py's target dicts: each process's RSS growth
    over the soak against the noise bound."""
    out = []
    for key, what in (("worker", f"{figures['runs']:,} in-flight sleeping runs"),
                      ("api", f"{figures['streams']:,} idle SSE streams")):
        f = figures[key]
        out.append({
            "name": f"6. {key} RSS growth over {figures['soak_min']:g} min, {what} "
                    f"(MiB; start {f['start_mib']:g} MiB)",
            "value": f["growth_over_soak_mib"],
            "target": f"<= {f['noise_mib']:g} (noise)",
            "met": bool(f["passed"]),
        })
    return out


def scale_measure(url: str, quick: bool) -> dict[str, Any]:
    """Target 6 for bench/scale.py, on its server: the full soak, or with
    --quick a 90-second one (samples every 7.5 s) to keep the run in five
    minutes."""
    if quick:
        return measure(url, minutes=1.5, every_s=7.5, warmup_s=15.0)
    return measure(url)


def print_report(figures: dict[str, Any]) -> None:
    w, a = figures["worker"], figures["api"]
    print(f"\nsoak: {figures['soak_min']:g} min after a {figures['warmup_s']:g} s warm-up, "
          f"RSS sampled every {figures['every_s']:g} s, {figures['machine']['cpus']} CPUs\n")
    print_table(["process", "load", "idle MiB", "start MiB", "end MiB", "peak MiB",
                 "KiB per item", "MiB/min", "verdict"], [
        ["worker", f"{figures['runs']:,} runs in flight ({w['in_flight_at_end']:,} at end)",
         w["idle_mib"], w["start_mib"], w["end_mib"], w["peak_mib"], w["per_item_kib"],
         w["growth_mib_per_min"], "pass" if w["passed"] else "FAIL"],
        ["api", f"{figures['streams']:,} idle streams ({a['open_at_end']:,} open at end)",
         a["idle_mib"], a["start_mib"], a["end_mib"], a["peak_mib"], a["per_item_kib"],
         a["growth_mib_per_min"], "pass" if a["passed"] else "FAIL"],
    ])
    if figures["refused_streams"]:
        print(f"\nrefused streams (first): {figures['refused_streams']}")
    verdict = "PASS" if w["passed"] and a["passed"] else "FAIL"
    print(f"\n{verdict}: growth over the soak worker {w['growth_over_soak_mib']:+.2f} MiB "
          f"(noise {w['noise_mib']:g}), api {a['growth_over_soak_mib']:+.2f} MiB "
          f"(noise {a['noise_mib']:g}); the load still there at the end: "
          f"{w['in_flight_at_end']:,} runs, {a['open_at_end']:,} streams")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--database-url")
    ap.add_argument("--quick", action="store_true", help="a 2-minute soak")
    ap.add_argument("--minutes", type=float, help="soak length (default 10; --quick 2)")
    ap.add_argument("--runs", type=int, default=1000, help="in-flight sleeping runs")
    ap.add_argument("--streams", type=int, default=1000, help="idle SSE streams")
    ap.add_argument("--every", type=float, help="seconds between samples")
    ap.add_argument("--warmup", type=float, help="seconds between load ready and the first sample")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.streams > args.runs:
        ap.error("--streams must not exceed --runs (one stream per run)")
    with terminate_as_interrupt():
        figures = measure(args.database_url, quick=args.quick, minutes=args.minutes,
                          runs=args.runs, streams=args.streams, every_s=args.every,
                          warmup_s=args.warmup)
    figures["targets"] = targets(figures)
    if args.json:
        emit_json(figures)
    else:
        print_report(figures)


if __name__ == "__main__":
    main()
