"""Profile one `runlease worker` draining no-op runs, as bench/throughput.py runs it.

    python bench/profile_drain.py [--jobs 20000] [--out docs/img/drain-flame.svg]
                                  [--format flamegraph|speedscope|raw]

Enqueues the runs, starts one worker process (concurrency 100, the agent
`bench.agents:noop`, heartbeats on), attaches py-spy to it the moment it is
spawned (`py-spy record --pid`, 250 samples/s, idle samples left out), and
stops the profile when every run is done. py-spy must be installed
(`pip install py-spy`); as a non-root user the kernel may refuse to let it
read another process (ptrace_scope).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import fresh_database, server
from claim import load_store
from throughput import WorkerProc, scalar, terminate_as_interrupt

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--database-url")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "drain-flame.svg"))
    ap.add_argument("--format", default="flamegraph",
                    choices=("flamegraph", "speedscope", "raw"))
    ap.add_argument("--rate", type=int, default=250, help="samples per second")
    args = ap.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    log_dir = Path(tempfile.mkdtemp(prefix="runlease-bench-profile-"))
    with terminate_as_interrupt(), server(args.database_url) as base:
        url = fresh_database(base, "runlease_bench_profile")
        load_store(url, args.jobs, pool="default")
        worker = WorkerProc(url, "profile", {"agent": "bench.agents:noop",
                                             "concurrency": args.concurrency}, log_dir).start()
        assert worker.proc is not None
        spy = subprocess.Popen([py_spy, "record", "--pid", str(worker.proc.pid), "--rate",
                                str(args.rate), "--format", args.format, "-o", args.out,
                                "--nonblocking"], stdout=subprocess.DEVNULL)
        try:
            t0 = time.perf_counter()
            with psycopg.connect(url, autocommit=True) as poll:
                while scalar(poll, "SELECT count(*) FROM agent_runs WHERE status <> 'done'"):
                    worker.check_alive()
                    time.sleep(0.05)
                drain_s = float(scalar(poll, "SELECT extract(epoch FROM max(finished_at) - "
                                             "min(finished_at)) FROM agent_runs"))
            wall_s = time.perf_counter() - t0
        finally:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            spy.wait(60)
            worker.stop()
    print(f"{args.jobs:,} runs: drain {args.jobs / drain_s:,.0f} jobs/s, wall "
          f"{args.jobs / wall_s:,.0f} jobs/s (under py-spy, {args.rate} samples/s); "
          f"profile in {args.out}")


if __name__ == "__main__":
    main()
