"""A burst onto an idle queue: the drain when the planner's statistics are stale.

    python bench/burst.py [--database-url URL] [--jobs 20000] [--json]

Agent traffic is bursty: a pool sits idle, autovacuum analyzes its table with
nothing pending, then thousands of runs arrive at once. Every other bench runs
VACUUM ANALYZE after loading, so none of them shows what the claim costs
when the statistics say the queue is empty. This one drains the same burst
of no-op runs (`jobs`, two `runlease worker` processes, concurrency 50: the
issue's shape) on one server, in one run, after four different histories of
the table (bench/claim.py STATS_STATES):

- analyzed: VACUUM ANALYZE after the load (the reference, what benches do);
- idle_analyzed: the table analyzed empty, then the burst, no ANALYZE;
- truncated: TRUNCATE (no statistics of its new file), then the burst;
- million_done: 1,000,000 done runs analyzed, then the burst.

The figure of each stale state is its drain rate divided by the reference's
(target: >= 0.9). PgQueuer drains the same burst with and without ANALYZE
beside it when installed (the `bench` extra). Autovacuum stays on, as in
production: an autoanalyze that lands mid-drain is part of what users see.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import emit_json, fresh_database, machine, print_table, server
from claim import STATS_STATES
from throughput import drain_ours, note, ratio, terminate_as_interrupt

TARGET = 0.9
PROCESSES = 2
CONCURRENCY = 50


def collect(base: str | None, *, jobs: int, timeout_s: float,
            peers: bool = True) -> dict[str, Any]:
    figures: dict[str, Any] = {"jobs": jobs, "processes": PROCESSES,
                               "concurrency": CONCURRENCY, "machine": machine(),
                               "states": {}}
    log_dir = Path(tempfile.mkdtemp(prefix="runlease-bench-burst-"))
    with terminate_as_interrupt(), server(base) as base_url:
        for state in STATS_STATES:
            # A database per state: no state inherits another's statistics.
            url = fresh_database(base_url, f"runlease_bench_burst_{state}")
            try:
                r = drain_ours(url, jobs, PROCESSES, CONCURRENCY, timeout_s, log_dir,
                               stats=state)
            except Exception as exc:  # the other states' figures still count
                r = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
            figures["states"][state] = r
            note(f"runlease {state}: {r.get('drain_jobs_per_s', r.get('error'))} runs/s")
        if peers and importlib.util.find_spec("pgqueuer") is not None:
            import peers as peer_bench  # bench/peers.py

            for analyze in (True, False):
                key = "pgqueuer_analyzed" if analyze else "pgqueuer_burst"
                try:
                    figures[key] = peer_bench.bench_pgqueuer(base_url, jobs=jobs,
                                                             timeout_s=timeout_s,
                                                             analyze=analyze)
                except Exception as exc:
                    figures[key] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
                note(f"{key}: {figures[key].get('jobs_per_s', figures[key].get('error'))}")
    ref = figures["states"]["analyzed"].get("drain_jobs_per_s")
    figures["ratios"] = {s: ratio(r.get("drain_jobs_per_s"), ref)
                         for s, r in figures["states"].items() if s != "analyzed"}
    figures["worker_logs"] = str(log_dir)
    return figures


def measure(url: str, quick: bool) -> dict[str, Any]:
    """bench/scale.py's burst target, on its server."""
    return collect(url, jobs=20_000, timeout_s=300, peers=False)


def targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    ref = figures["states"]["analyzed"].get("drain_jobs_per_s")
    out = []
    for state, value in figures["ratios"].items():
        got = figures["states"][state].get("drain_jobs_per_s")
        out.append({
            "name": f"8. burst drain, {state} / analyzed ({got} vs {ref} runs/s,"
                    f" {figures['jobs']:,} runs, P={PROCESSES} x c={CONCURRENCY})",
            "value": value, "target": f">= {TARGET:g}",
            "met": value is not None and value >= TARGET})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--database-url", help="a server to use (default: an embedded one)")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    figures = collect(args.database_url, jobs=args.jobs, timeout_s=args.timeout,
                      peers=not args.no_peers)
    if args.json:
        emit_json(figures)
        return
    rows = [[state, r.get("drain_jobs_per_s", r.get("error")), figures["ratios"].get(state, 1.0),
             r.get("server_cpu_ms_per_run"), r.get("worker_cpu_ms_per_run")]
            for state, r in figures["states"].items()]
    for key in ("pgqueuer_analyzed", "pgqueuer_burst"):
        if key in figures:
            rows.append([key, figures[key].get("jobs_per_s", figures[key].get("error")),
                         "", "", ""])
    print_table(["state", "drain runs/s", "vs analyzed", "server ms/run", "worker ms/run"],
                rows)
    for t in targets(figures):
        print(f"{t['name']}: {t['value']} (target {t['target']}, "
              f"{'met' if t['met'] else 'NOT met'})")


if __name__ == "__main__":
    main()
