"""End-to-end throughput: no-op runs drained by real `runlease worker` processes.

    python bench/throughput.py [--database-url URL] [--jobs 20000] [--pgbouncer] [--json]

For P = 1, 2, 4 worker processes (`python -m runlease worker`, settings from
RUNLEASE_* variables, the agent `bench.agents:noop`): enqueue `jobs` runs
first (timed on its own), then start the workers and time from their spawn
until every run is done (the parent polls every 50 ms whether a run is still
pending or leased: two EXISTS on the partial indexes, as cheap for the server
as the peers' EXISTS poll; a count(*) of the table cost ~10 ms of the
server's CPU per poll, a fifth of a core taken from the drain it measured).
Settings are the idiomatic ones: `--concurrency` slots per process, claim
batch = half the slots (the default), acks grouped by the worker's acker,
heartbeats on (default interval), one reaper (the others --no-reaper),
metrics off, log level WARNING (the peers' workers log warnings only too).

On the same server, in the same run:

- the raw SQL floor: bench/claim.py's seed statements, K=4 claimers, batch 50;
- PgQueuer and Procrastinate draining as many no-op jobs (bench/peers.py),
  when those libraries are importable (the `bench` extra).

Two figures per worker count: `wall` (spawn -> all done, as specified: it
includes interpreter start, imports and connecting) and `drain` (first to
last ack, by the server's clock: finished_at), which is what the peers' and
the raw floor's figures measure (they start their clock once the consumers
are connected). Targets (shown, not asserted): >= 3x PgQueuer and >= 0.5 of
the raw batched floor. Without --database-url a durable embedded PostgreSQL
is started (fsync on).

With --pgbouncer, each worker count also drains through a real PgBouncer in
transaction pooling mode (Debian's `pgbouncer`, started as the tests start it:
tests/support/pgbouncer.py, 20 server connections): the workers' database_url
is the bouncer's, prepared statements off, LISTEN on the direct URL; the table
shows that drain beside the direct one.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import emit_json, fresh_database, machine, print_table, server, server_cpu_s
from claim import load_store

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(1, str(ROOT))  # tests.support.pgbouncer

# PgBouncer's server connections per database for --pgbouncer.
BOUNCER_POOL_SIZE = 20

POLL_S = 0.05
# The pool every drain here fills (the default one: no tenant cap).
DRAIN_POOL = "default"
# Whether a run is unfinished, each EXISTS stating a partial index's own
# predicate (pending and due: agent_runs_claim_idx; pending and delayed;
# leased), so the plan is an index probe whatever the statistics say. A
# bare `status = 'pending'` matches no index since migration 0015: with the
# statistics of a million done runs it was a parallel scan of the whole
# table, 31 ms every 50 ms, a third of a core taken from the drain measured.
UNFINISHED_SQL = ("SELECT EXISTS (SELECT 1 FROM agent_runs WHERE status = 'pending'"
                  "               AND NOT delayed AND fair_seq >= 0)"
                  " OR EXISTS (SELECT 1 FROM agent_runs WHERE status = 'pending' AND delayed)"
                  " OR EXISTS (SELECT 1 FROM agent_runs WHERE status = 'leased')")
# A run of the drain's pool has finished (agent_runs_finished_idx: pool,
# finished_at): the drain began, startup is over. (Runs finished after the
# workers started: the million_done state holds older ones.)
FIRST_DONE_SQL = ("SELECT EXISTS (SELECT 1 FROM agent_runs"
                  f" WHERE pool = '{DRAIN_POOL}' AND finished_at >= %s)")
# First to last ack of the drain, by the server's clock (the same index).
DRAIN_S_SQL = ("SELECT extract(epoch FROM max(finished_at) - min(finished_at)) FROM agent_runs"
               f" WHERE pool = '{DRAIN_POOL}' AND finished_at >= %s")
LEFT_SQL = "SELECT count(*) FROM agent_runs WHERE status <> 'done'"
NOT_INSTALLED = "not installed (pip install -e '.[bench]')"
TARGET_VS_PGQUEUER = 3.0
TARGET_VS_RAW = 0.5


# --------------------------------------------------------------------------
# Worker processes (also used by bench/latency.py)
# --------------------------------------------------------------------------


class WorkerProc:
    """One `python -m runlease worker` in its own session, settings as env."""

    def __init__(self, url: str, name: str, settings: Mapping[str, object],
                 log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("RUNLEASE_") and k != "DATABASE_URL"}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env.update({
            "RUNLEASE_DATABASE_URL": url,
            "RUNLEASE_METRICS_PORT": "0",
            "RUNLEASE_LOG_LEVEL": "WARNING",
            "POD_UID": f"bench-{name}",
        })
        for key, value in settings.items():
            env["RUNLEASE_" + key.upper()] = (str(value).lower() if isinstance(value, bool)
                                              else str(value))
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def identity_prefix(self) -> str:
        """Every worker id of this process starts with this (POD_UID:...)."""
        return f"bench-{self.name}:"

    def start(self) -> WorkerProc:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runlease", "worker"], env=self.env, cwd=ROOT,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"worker {self.name} exited with code {self.proc.returncode}\n"
                               + self.log_tail())

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the process has used so far."""
        assert self.proc is not None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill9(self) -> None:
        """kill -9 of the worker process alone (its session is cleaned up later)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM (the worker drains), then SIGKILL of the whole session."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace_s)
        self.kill()

    def kill(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def log_tail(self, limit: int = 3000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- {self.name} log ---\n{text[-limit:]}" if text else ""


@contextlib.contextmanager
def worker_fleet(url: str, log_dir: Path) -> Iterator[list[WorkerProc]]:
    """A list to put started workers in; every one is killed (whole session) at exit."""
    procs: list[WorkerProc] = []
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, so every finally (child kills, server
    stop) runs; Ctrl-C exits with 130 and no traceback."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    except KeyboardInterrupt:
        print("interrupted: child processes killed", file=sys.stderr)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)


def scalar(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


# --------------------------------------------------------------------------
# runlease
# --------------------------------------------------------------------------


def drain_ours(url: str, jobs: int, processes: int, concurrency: int, timeout_s: float,
               log_dir: Path, bouncer_url: str | None = None,
               stats: str = "analyzed") -> dict[str, Any]:
    """bouncer_url: the workers connect through it (prepared statements off,
    LISTEN on url); enqueueing and polling stay direct. stats: what the
    planner knows when the burst lands (bench/claim.py STATS_STATES)."""
    # The default pool keeps its migration defaults: no tenant cap.
    enqueue_s = load_store(url, jobs, pool=DRAIN_POOL, stats=stats)
    load_before = os.getloadavg()[0]
    through: dict[str, object] = ({"listen_database_url": url, "prepared_statements": False}
                                  if bouncer_url else {})
    tag = "pgb" if bouncer_url else "tp"
    with psycopg.connect(url, autocommit=True) as poll, worker_fleet(url, log_dir) as fleet:
        started_at = scalar(poll, "SELECT now()")
        t0 = time.perf_counter()
        for i in range(processes):
            fleet.append(WorkerProc(bouncer_url or url, f"{tag}{processes}-{i}", {
                "agent": "bench.agents:noop",
                "concurrency": concurrency,
                "reaper": i == 0,
                **through,
            }, log_dir).start())
        deadline = t0 + timeout_s
        cpu_at_first: float | None = None
        server_at_first: float | None = None
        while scalar(poll, UNFINISHED_SQL):
            if cpu_at_first is None and scalar(poll, FIRST_DONE_SQL, (started_at,)):
                cpu_at_first = sum(p.cpu_s() for p in fleet)  # the drain began
                server_at_first = server_cpu_s(url)
            for p in fleet:
                p.check_alive()
            if time.perf_counter() > deadline:
                left = scalar(poll, LEFT_SQL)
                raise TimeoutError(f"{processes} worker(s): {left} of {jobs} runs not done "
                                   f"after {timeout_s:.0f} s\n"
                                   + "\n".join(p.log_tail() for p in fleet))
            time.sleep(POLL_S)
        wall_s = time.perf_counter() - t0
        cpu_s = sum(p.cpu_s() for p in fleet) - (cpu_at_first or 0.0)
        server_at_end = server_cpu_s(url)
        if left := scalar(poll, LEFT_SQL):
            raise RuntimeError(f"{left} of {jobs} runs ended other than done")
        drain_s = float(scalar(poll, DRAIN_S_SQL, (started_at,)))
        for p in fleet:  # graceful: SIGTERM drains (nothing left to run)
            p.stop(grace_s=15)
        warnings = [line for p in fleet for line in p.log_tail(100_000).splitlines()
                    if " WARNING " in line or " ERROR " in line]
    return {
        "processes": processes,
        "concurrency": concurrency,
        "pgbouncer": bool(bouncer_url),
        "enqueue_s": round(enqueue_s, 4),
        "enqueue_runs_per_s": round(jobs / enqueue_s, 1),
        "wall_s": round(wall_s, 4),
        "jobs_per_s": round(jobs / wall_s, 1),
        "drain_s": round(drain_s, 4),
        "drain_jobs_per_s": round(jobs / drain_s, 1) if drain_s > 0 else None,
        "startup_s": round(wall_s - drain_s, 4),
        # The workers' own CPU (user + system) from the first ack seen to the
        # last, per run: what the worker's Python costs, much less moved by
        # the neighbours' load than the rates are.
        "worker_cpu_ms_per_run": round(cpu_s * 1000 / jobs, 4),
        # The server's (postmaster and children), over the same span; None
        # when its processes cannot be read (a remote server).
        "server_cpu_ms_per_run": (round((server_at_end - server_at_first) * 1000 / jobs, 4)
                                  if server_at_first is not None and server_at_end is not None
                                  else None),
        "host_loadavg_1m_before": round(load_before, 2),
        "worker_warnings": warnings[:20],
    }


# --------------------------------------------------------------------------
# Floor and peers
# --------------------------------------------------------------------------


def raw_floor(url: str, jobs: int, claimers: int, batch: int,
              stats: str = "analyzed") -> dict[str, Any]:
    """The seed's claim + ack, `claimers` processes, batch `batch`, on a
    table whose statistics are in state `stats` (bench/claim.py STATS_STATES)."""
    import claim  # bench/claim.py: its spawned claimers import it by name too

    load_before = os.getloadavg()[0]
    rate = claim.measure(url, "raw", claimers, batch, jobs, stats=stats)
    return {"claimers": claimers, "batch": batch, "stats": stats,
            "jobs_per_s": round(rate, 1), "host_loadavg_1m_before": round(load_before, 2)}


def run_peer(name: str, url: str, jobs: int, timeout_s: float) -> dict[str, Any]:
    if importlib.util.find_spec(name) is None:
        return {"peer": name, "status": NOT_INSTALLED}
    import peers  # bench/peers.py

    bench = peers.bench_pgqueuer if name == "pgqueuer" else peers.bench_procrastinate
    try:
        result: dict[str, Any] = bench(url, jobs=jobs, timeout_s=timeout_s)
    except Exception as exc:  # one peer failing must not lose the other figures
        return {"peer": name, "status": f"failed: {type(exc).__name__}: {exc}"[:2000]}
    result["status"] = "ok"
    return result


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def verdict(value: float | None, target: float) -> str:
    if value is None:
        return "n/a"
    return "met" if value >= target else "NOT met"


def summarize(figures: dict[str, Any]) -> None:
    best = max(figures["ours"], key=lambda r: r["jobs_per_s"])
    best_drain = max(figures["ours"], key=lambda r: r["drain_jobs_per_s"] or 0)
    pgq = figures["pgqueuer"].get("jobs_per_s")
    raw = figures["raw_floor"]["jobs_per_s"]
    figures["best"] = {"processes": best["processes"], "jobs_per_s": best["jobs_per_s"],
                       "drain_processes": best_drain["processes"],
                       "drain_jobs_per_s": best_drain["drain_jobs_per_s"]}
    figures["ratios"] = {
        "ours_wall_vs_pgqueuer": ratio(best["jobs_per_s"], pgq),
        "ours_drain_vs_pgqueuer": ratio(best_drain["drain_jobs_per_s"], pgq),
        "ours_wall_vs_procrastinate": ratio(best["jobs_per_s"],
                                            figures["procrastinate"].get("jobs_per_s")),
        "ours_drain_vs_procrastinate": ratio(best_drain["drain_jobs_per_s"],
                                             figures["procrastinate"].get("jobs_per_s")),
        "ours_wall_vs_raw": ratio(best["jobs_per_s"], raw),
        "ours_drain_vs_raw": ratio(best_drain["drain_jobs_per_s"], raw),
    }
    if figures.get("ours_pgbouncer"):
        best_pgb = max(figures["ours_pgbouncer"], key=lambda r: r["drain_jobs_per_s"] or 0)
        figures["best"]["pgbouncer_drain_jobs_per_s"] = best_pgb["drain_jobs_per_s"]
        figures["ratios"]["pgbouncer_drain_vs_direct"] = ratio(
            best_pgb["drain_jobs_per_s"], best_drain["drain_jobs_per_s"])
        figures["ratios"]["pgbouncer_drain_vs_pgqueuer"] = ratio(
            best_pgb["drain_jobs_per_s"], pgq)
    r = figures["ratios"]
    figures["targets"] = {
        "vs_pgqueuer": {"target": TARGET_VS_PGQUEUER,
                        "wall": verdict(r["ours_wall_vs_pgqueuer"], TARGET_VS_PGQUEUER),
                        "drain": verdict(r["ours_drain_vs_pgqueuer"], TARGET_VS_PGQUEUER)},
        "vs_raw": {"target": TARGET_VS_RAW,
                   "wall": verdict(r["ours_wall_vs_raw"], TARGET_VS_RAW),
                   "drain": verdict(r["ours_drain_vs_raw"], TARGET_VS_RAW)},
    }


def print_report(figures: dict[str, Any]) -> None:
    jobs = figures["jobs"]
    print(f"\n{jobs:,} no-op runs, PostgreSQL {figures['server']} "
          f"({'durable embedded' if figures['embedded'] else 'given URL'}), "
          f"{figures['machine']['cpus']} CPUs\n")
    rows: list[Sequence[Any]] = []
    for r in figures["ours"] + figures.get("ours_pgbouncer", []):
        via = " via PgBouncer" if r["pgbouncer"] else ""
        rows.append([f"runlease{via} P={r['processes']} x c={r['concurrency']}",
                     r["jobs_per_s"], r["drain_jobs_per_s"], r["wall_s"], r["startup_s"],
                     r["enqueue_runs_per_s"], r["host_loadavg_1m_before"],
                     r["worker_cpu_ms_per_run"], r["server_cpu_ms_per_run"]])
    raw = figures["raw_floor"]
    rows.append([f"raw SQL floor K={raw['claimers']} batch={raw['batch']}", "",
                 raw["jobs_per_s"], "", "", "", raw["host_loadavg_1m_before"], "", ""])
    for name in ("pgqueuer", "procrastinate"):
        p = figures[name]
        if p.get("status") != "ok":
            rows.append([name, p["status"], "", "", "", "", "", "", ""])
            continue
        s = p["settings"]
        shape = (f"consumers={s['consumers']} batch={s['batch_size']}" if name == "pgqueuer"
                 else f"concurrency={s['concurrency']}")
        rows.append([f"{name} {p['version']} {shape}", "", p["jobs_per_s"], "",
                     p["startup_s"], round(jobs / p["enqueue_s"], 1) if p["enqueue_s"] else "",
                     p["host_loadavg_1m_before"], "", ""])
    print_table(["queue", "wall jobs/s", "drain jobs/s", "wall s", "startup s",
                 "enqueue runs/s", "load1", "worker CPU ms/run", "server CPU ms/run"], rows)
    r, t = figures["ratios"], figures["targets"]
    b = figures["best"]
    print(f"\nbest runlease: {b['jobs_per_s']:,.0f} jobs/s wall (P={b['processes']}), "
          f"{b['drain_jobs_per_s']:,.0f} jobs/s drain (P={b['drain_processes']})")

    def show(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    print_table(["ratio (best runlease)", "wall", "drain", "target", "verdict wall/drain"], [
        ["ours / PgQueuer", show(r["ours_wall_vs_pgqueuer"]), show(r["ours_drain_vs_pgqueuer"]),
         f">= {TARGET_VS_PGQUEUER:g}", f"{t['vs_pgqueuer']['wall']} / {t['vs_pgqueuer']['drain']}"],
        ["ours / Procrastinate", show(r["ours_wall_vs_procrastinate"]),
         show(r["ours_drain_vs_procrastinate"]), "", ""],
        ["ours / raw floor", show(r["ours_wall_vs_raw"]), show(r["ours_drain_vs_raw"]),
         f">= {TARGET_VS_RAW:g}", f"{t['vs_raw']['wall']} / {t['vs_raw']['drain']}"],
    ])
    if "pgbouncer_drain_vs_direct" in r:
        print(f"\nthrough PgBouncer (transaction pooling): best drain "
              f"{b['pgbouncer_drain_jobs_per_s']:,.0f} jobs/s = "
              f"{show(r['pgbouncer_drain_vs_direct'])} of the direct drain; "
              f"vs PgQueuer (direct): {show(r['pgbouncer_drain_vs_pgqueuer'])}")
    print("\n(wall = worker spawn -> all done, polled every 50 ms, includes interpreter start "
          "and connecting;\n drain = first -> last ack by the server's clock, comparable to the "
          "peers' and the raw floor's figures,\n which start once their consumers are "
          "connected; targets shown, not asserted; noisy shared machine)")
    for r_ in figures["ours"]:
        if r_["worker_warnings"]:
            print(f"\nworker warnings (P={r_['processes']}):", *r_["worker_warnings"][:5],
                  sep="\n  ")


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def collect(base: str | None, *, jobs: int, counts: Sequence[int], concurrency: int,
            repeat: int, raw_claimers: int, raw_batch: int, peers: Sequence[str],
            timeout_s: float, pgbouncer_counts: Sequence[int]) -> dict[str, Any]:
    """Every drain on one server (`base`, or an embedded one): ours at each
    worker count (and through PgBouncer at `pgbouncer_counts`), the raw floor,
    the peers; summarized (best, ratios, verdicts)."""
    figures: dict[str, Any] = {"jobs": jobs, "machine": machine(),
                               "embedded": not base, "ours": []}
    log_dir = Path(tempfile.mkdtemp(prefix="runlease-bench-throughput-"))
    with terminate_as_interrupt(), server(base) as base_url, \
            contextlib.ExitStack() as stack:
        url = fresh_database(base_url, "runlease_bench_throughput")
        with psycopg.connect(url) as conn:
            figures["server"] = scalar(conn, "SHOW server_version")
            figures["fsync"] = scalar(conn, "SHOW fsync")  # scale.py's server: off
        bouncer_url = None
        if pgbouncer_counts:
            from tests.support.pgbouncer import running_pgbouncer

            bouncer = stack.enter_context(running_pgbouncer(url, pool_size=BOUNCER_POOL_SIZE))
            bouncer_url = bouncer.url(url)
            figures["ours_pgbouncer"] = []
        for n in counts:
            for via in ([None, bouncer_url] if bouncer_url and n in pgbouncer_counts
                        else [None]):
                runs = [drain_ours(url, jobs, n, concurrency, timeout_s, log_dir,
                                   bouncer_url=via) for _ in range(repeat)]
                best = max(runs, key=lambda r: r["jobs_per_s"])
                best["all_jobs_per_s"] = [r["jobs_per_s"] for r in runs]
                figures["ours_pgbouncer" if via else "ours"].append(best)
                note(f"runlease{' via PgBouncer' if via else ''} P={n}: "
                     f"{best['jobs_per_s']:,.0f} jobs/s wall, "
                     f"{best['drain_jobs_per_s']:,.0f} drain")
        figures["raw_floor"] = raw_floor(url, jobs, raw_claimers, raw_batch)
        note(f"raw floor: {figures['raw_floor']['jobs_per_s']:,.0f} jobs/s")
        for name in ("pgqueuer", "procrastinate"):
            figures[name] = (run_peer(name, base_url, jobs, timeout_s) if name in peers
                             else {"peer": name, "status": "skipped (--no-peers, --peers)"})
            note(f"{name}: {figures[name].get('jobs_per_s', figures[name]['status'])}")
    figures["worker_logs"] = str(log_dir)
    summarize(figures)
    return figures


# bench/scale.py's targets 5 and 7: the drains it runs (a quick run stays
# within a minute or two of its five).
class ScaleRuns(NamedTuple):
    jobs: int
    counts: tuple[int, ...]
    repeat: int


SCALE_RUNS = {True: ScaleRuns(10_000, (1, 2), 1), False: ScaleRuns(20_000, (1, 2, 4), 2)}
SCALE_PGBOUNCER_AT = 2


def measure(url: str, quick: bool) -> dict[str, Any]:
    """Targets 5 and 7 for bench/scale.py, on its server: our drain at each
    worker count, at SCALE_PGBOUNCER_AT processes also through PgBouncer,
    the raw floor and PgQueuer. A drain that fails (runs left undone, a
    worker dead, no pgbouncer binary) is reported as such, not raised."""
    runs = SCALE_RUNS[quick]
    try:
        return collect(url, jobs=runs.jobs, counts=runs.counts, concurrency=100,
                       repeat=runs.repeat, raw_claimers=4, raw_batch=50,
                       peers=["pgqueuer"], timeout_s=120,
                       pgbouncer_counts=[SCALE_PGBOUNCER_AT])
    except Exception as exc:  # the other targets' figures still count
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


def targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Target 5 (drain against PgQueuer and the raw floor) and target 7
    (the drain through PgBouncer) as bench/scale.py's target dicts."""
    if "error" in figures:
        failed = f"failed: {figures['error'][:300]}"
        return [{"name": "5. faster drain (bench/throughput.py)", "value": None,
                 "target": failed, "met": False},
                {"name": "7. drain through PgBouncer (bench/throughput.py)", "value": None,
                 "target": failed, "met": False}]
    r, b = figures["ratios"], figures["best"]
    pgq, raw = figures["pgqueuer"].get("jobs_per_s"), figures["raw_floor"]["jobs_per_s"]
    shape = (f"best of P = {', '.join(str(o['processes']) for o in figures['ours'])}"
             f" x c=100, {figures['jobs']:,} no-op runs")
    out = [
        {"name": f"5. drain / PgQueuer (psycopg), {shape}: {b['drain_jobs_per_s']:,.0f} vs "
                 + (f"{pgq:,.0f} jobs/s" if pgq else figures["pgqueuer"].get("status", "-")),
         "value": r["ours_drain_vs_pgqueuer"], "target": f">= {TARGET_VS_PGQUEUER:g}",
         "met": (r["ours_drain_vs_pgqueuer"] or 0) >= TARGET_VS_PGQUEUER},
        {"name": f"5. drain / raw claim-50 + ack floor: {b['drain_jobs_per_s']:,.0f} vs"
                 f" {raw:,.0f} jobs/s",
         "value": r["ours_drain_vs_raw"], "target": f">= {TARGET_VS_RAW:g}",
         "met": (r["ours_drain_vs_raw"] or 0) >= TARGET_VS_RAW},
    ]
    via = figures.get("ours_pgbouncer") or []
    if via:
        v = via[0]
        out.append({
            "name": f"7. drain through PgBouncer (transaction pooling, prepared statements off,"
                    f" LISTEN direct), P={v['processes']}: jobs/s"
                    f" ({r.get('pgbouncer_drain_vs_direct')} of the direct drain)",
            "value": v["drain_jobs_per_s"],
            # drain_ours raises unless every run ended done: a figure here
            # means the whole drain went through the bouncer.
            "target": f"all {figures['jobs']:,} runs done through it",
            "met": True})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--database-url")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--processes", default="1,2,4", help="worker process counts to try")
    parser.add_argument("--concurrency", type=int, default=100, help="slots per worker process")
    parser.add_argument("--repeat", type=int, default=1, help="runs per worker count (best kept)")
    parser.add_argument("--raw-claimers", type=int, default=4)
    parser.add_argument("--raw-batch", type=int, default=50)
    parser.add_argument("--no-peers", action="store_true", help="skip PgQueuer and Procrastinate")
    parser.add_argument("--peers", default="pgqueuer,procrastinate",
                        help="which peers to run (comma-separated)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per drain")
    parser.add_argument("--pgbouncer", action="store_true",
                        help="also drain through a real PgBouncer (transaction pooling)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    counts = [int(p) for p in args.processes.split(",")]

    figures = collect(args.database_url, jobs=args.jobs, counts=counts,
                      concurrency=args.concurrency, repeat=args.repeat,
                      raw_claimers=args.raw_claimers, raw_batch=args.raw_batch,
                      peers=[] if args.no_peers else args.peers.split(","),
                      timeout_s=args.timeout,
                      pgbouncer_counts=counts if args.pgbouncer else [])
    if args.json:
        emit_json(figures)
    else:
        print_report(figures)


if __name__ == "__main__":
    main()
