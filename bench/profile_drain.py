"""Profile one `runlease worker` draining no-op runs, as bench/throughput.py runs it.

    python bench/profile_drain.py [--jobs 20000] [--out docs/img/drain-flame.svg]
                                  [--format flamegraph|speedscope|raw]
                                  [--db-stats] [--no-spy] [--processes 1]

Enqueues the runs, starts one worker process (concurrency 100, the agent
`bench.agents:noop`, heartbeats on), attaches py-spy to it the moment it is
spawned (`py-spy record --pid`, 250 samples/s, idle samples left out), and
stops the profile when every run is done. py-spy must be installed
(`pip install py-spy`); as a non-root user the kernel may refuse to let it
read another process (ptrace_scope).

--db-stats: the database's side of the same drain, from pg_stat_statements
(statements inside PL/pgSQL functions included: track = all): per
statement, calls, rows per call, mean and total execution time, and the
share of the drain's wall time. Without --database-url the embedded server
is started with the extension preloaded; a given server must preload it
(shared_preload_libraries) itself.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import fresh_database, print_table, server, server_cpu_s
from claim import STATS_STATES, load_store
from throughput import (
    DRAIN_POOL,
    DRAIN_S_SQL,
    FIRST_DONE_SQL,
    UNFINISHED_SQL,
    WorkerProc,
    scalar,
    terminate_as_interrupt,
)

ROOT = Path(__file__).resolve().parents[1]

STATS = """
SELECT calls, rows, total_exec_time, mean_exec_time, toplevel,
       regexp_replace(left(query, 400), '\\s+', ' ', 'g')
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
 ORDER BY total_exec_time DESC
 LIMIT %(top)s
"""


@contextlib.contextmanager
def stats_server(url: str | None) -> Iterator[str]:
    """A server with pg_stat_statements loaded (tracking nested statements)."""
    if url:
        yield url
        return
    with server(None) as base:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
        from runlease.db.embedded import EmbeddedPostgres

        port = psycopg.conninfo.conninfo_to_dict(base)["port"]
        data = Path(tempfile.gettempdir())
        pg = next((EmbeddedPostgres(p.parent) for p in data.glob("runlease-bench-*/pgdata")
                   if EmbeddedPostgres(p.parent).running_port() == int(str(port))), None)
        if pg is None:
            raise SystemExit("could not find the embedded server to restart it")
        pg.port = int(str(port))
        pg.restart("fast")
        yield base


def print_stats(url: str, drain_s: float, top: int) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(STATS, {"top": top}).fetchall()
    out = [{"calls": r[0], "rows_per_call": round(r[1] / r[0], 1) if r[0] else 0,
            "mean_ms": round(r[3], 3), "total_ms": round(r[2], 1),
            "share_of_drain": round(r[2] / 1000 / drain_s, 3) if drain_s else None,
            "toplevel": r[4], "query": r[5]} for r in rows]
    print_table(["calls", "rows/call", "mean ms", "total ms", "of drain", "top", "statement"],
                [[o["calls"], o["rows_per_call"], o["mean_ms"], o["total_ms"],
                  o["share_of_drain"], "y" if o["toplevel"] else "", o["query"][:90]]
                 for o in out])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--database-url")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--claim-batch", type=int, help="the workers' claim_batch (default: theirs)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "drain-flame.svg"))
    ap.add_argument("--format", default="flamegraph",
                    choices=("flamegraph", "speedscope", "raw"))
    ap.add_argument("--rate", type=int, default=250, help="samples per second")
    ap.add_argument("--no-spy", action="store_true", help="no py-spy (with --db-stats)")
    ap.add_argument("--stats", default="analyzed", choices=STATS_STATES,
                    help="what the planner knows when the runs land (bench/burst.py)")
    ap.add_argument("--db-stats", action="store_true",
                    help="print the drain's statements from pg_stat_statements")
    ap.add_argument("--top", type=int, default=25, help="statements shown by --db-stats")
    args = ap.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    log_dir = Path(tempfile.mkdtemp(prefix="runlease-bench-profile-"))
    serve = stats_server if args.db_stats else server
    with terminate_as_interrupt(), serve(args.database_url) as base:
        url = fresh_database(base, "runlease_bench_profile")
        load_store(url, args.jobs, pool=DRAIN_POOL, stats=args.stats)
        if args.db_stats:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
        workers = [WorkerProc(url, f"profile{i}", {"agent": "bench.agents:noop",
                                                   "concurrency": args.concurrency,
                                                   "reaper": i == 0,
                                                   **({"claim_batch": args.claim_batch}
                                                      if args.claim_batch else {})},
                              log_dir).start()
                   for i in range(args.processes)]
        spy = None
        if not args.no_spy:
            assert workers[0].proc is not None
            spy = subprocess.Popen([py_spy, "record", "--pid", str(workers[0].proc.pid),
                                    "--rate", str(args.rate), "--format", args.format,
                                    "-o", args.out, "--nonblocking"],
                                   stdout=subprocess.DEVNULL)
        try:
            t0 = time.perf_counter()
            cpu_at_first: float | None = None
            db_at_first: float | None = None
            with psycopg.connect(url, autocommit=True) as poll:
                started_at = scalar(poll, "SELECT now() - interval '1 minute'")
                while scalar(poll, UNFINISHED_SQL):
                    if cpu_at_first is None and scalar(poll, FIRST_DONE_SQL, (started_at,)):
                        cpu_at_first = sum(w.cpu_s() for w in workers)
                        db_at_first = server_cpu_s(url)
                    for w in workers:
                        w.check_alive()
                    time.sleep(0.05)
                cpu_s = sum(w.cpu_s() for w in workers) - (cpu_at_first or 0.0)
                db_at_end = server_cpu_s(url)
                # This drain's runs only: million_done holds older ones.
                drain_s = float(scalar(poll, DRAIN_S_SQL, (started_at,)))
            wall_s = time.perf_counter() - t0
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                spy.wait(60)
            for w in workers:
                w.stop()
        print(f"{args.jobs:,} runs, {args.processes} worker(s): drain "
              f"{args.jobs / drain_s:,.0f} jobs/s, wall {args.jobs / wall_s:,.0f} jobs/s, "
              f"worker CPU {cpu_s * 1000 / args.jobs:.3f} ms/run"
              + (f", server CPU {(db_at_end - db_at_first) * 1000 / args.jobs:.3f} ms/run"
                 if db_at_first is not None and db_at_end is not None else "")
              + (f" (under py-spy, {args.rate} samples/s); profile in {args.out}"
                 if spy is not None else ""))
        if args.db_stats:
            print_stats(url, drain_s, args.top)


if __name__ == "__main__":
    main()
