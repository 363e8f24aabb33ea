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
(target: >= 0.9; issue 26's target 1). PgQueuer drains the same burst with
and without ANALYZE beside it when installed (the `bench` extra), and the
raw floor (bench/claim.py's seed claim-50 + ack, K=4 processes) drains it
on a table in each of the same statistics states: issue 26's target 3,
our drain >= 3x PgQueuer and >= 0.5 of the floor, after ANALYZE and in the
burst case (idle_analyzed; PgQueuer on its freshly installed tables; no
ANALYZE for anyone). Autovacuum stays on, as in production: an autoanalyze
that lands mid-drain is part of what users see.
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
from throughput import (
    TARGET_VS_PGQUEUER,
    TARGET_VS_RAW,
    drain_ours,
    note,
    ratio,
    raw_floor,
    terminate_as_interrupt,
)

TARGET = 0.9
PROCESSES = 2
CONCURRENCY = 50
# The raw floor's shape, as bench/throughput.py's.
RAW_CLAIMERS = 4
RAW_BATCH = 50
# The burst case of the drain targets: the issue's own (a table analyzed
# with nothing pending, then the burst).
BURST_STATE = "idle_analyzed"


def collect(base: str | None, *, jobs: int, timeout_s: float,
            peers: bool = True, floor: bool = True,
            states: tuple[str, ...] = STATS_STATES) -> dict[str, Any]:
    """Our drain of the burst in each statistics state, one database each;
    with `floor`, the raw floor on the same database after it; with `peers`,
    PgQueuer after ANALYZE and without."""
    figures: dict[str, Any] = {"jobs": jobs, "processes": PROCESSES,
                               "concurrency": CONCURRENCY, "machine": machine(),
                               "states": {}, "raw_floor": {}}
    log_dir = Path(tempfile.mkdtemp(prefix="runlease-bench-burst-"))
    with terminate_as_interrupt(), server(base) as base_url:
        for state in states:
            # A database per state: no state inherits another's statistics.
            url = fresh_database(base_url, f"runlease_bench_burst_{state}")
            try:
                r = drain_ours(url, jobs, PROCESSES, CONCURRENCY, timeout_s, log_dir,
                               stats=state)
            except Exception as exc:  # the other states' figures still count
                r = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
            figures["states"][state] = r
            note(f"runlease {state}: {r.get('drain_jobs_per_s', r.get('error'))} runs/s")
            if floor:
                try:
                    f = raw_floor(url, jobs, RAW_CLAIMERS, RAW_BATCH, stats=state)
                except BaseException as exc:  # SystemExit of a short count too
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    f = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
                figures["raw_floor"][state] = f
                note(f"raw floor {state}: {f.get('jobs_per_s', f.get('error'))} jobs/s")
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
    figures["drain_ratios"] = drain_ratios(figures)
    figures["worker_logs"] = str(log_dir)
    return figures


def drain_ratios(figures: dict[str, Any]) -> dict[str, float | None]:
    """Our drain over PgQueuer's and over the raw floor's, after ANALYZE and
    in the burst case (no ANALYZE for anyone)."""
    out: dict[str, float | None] = {}
    for case, state, peer in (("analyzed", "analyzed", "pgqueuer_analyzed"),
                              ("burst", BURST_STATE, "pgqueuer_burst")):
        ours = figures["states"].get(state, {}).get("drain_jobs_per_s")
        out[f"{case}_vs_pgqueuer"] = ratio(ours, figures.get(peer, {}).get("jobs_per_s"))
        out[f"{case}_vs_raw"] = ratio(
            ours, figures.get("raw_floor", {}).get(state, {}).get("jobs_per_s"))
    return out


def measure(url: str, quick: bool) -> dict[str, Any]:
    """bench/scale.py's burst targets, on its server: the four states, the
    raw floor in each, PgQueuer with and without ANALYZE. The issue's burst
    is 20,000 runs, --quick or not."""
    try:
        return collect(url, jobs=20_000, timeout_s=300, peers=True, floor=True)
    except Exception as exc:  # the other targets' figures still count
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


def targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 26's targets 1 (8.: each stale state / analyzed) and 3 in the
    burst shape (9.: against PgQueuer and the raw floor, both cases)."""
    if "error" in figures:
        failed = f"failed: {figures['error'][:300]}"
        return [{"name": "8. burst drain (bench/burst.py)", "value": None,
                 "target": failed, "met": False}]
    shape = f"{figures['jobs']:,} runs, P={PROCESSES} x c={CONCURRENCY}"
    ref = figures["states"]["analyzed"].get("drain_jobs_per_s")
    out = []
    for state, value in figures["ratios"].items():
        got = figures["states"][state].get("drain_jobs_per_s")
        out.append({
            "name": f"8. burst drain, {state} / analyzed ({got} vs {ref} runs/s, {shape})",
            "value": value, "target": f">= {TARGET:g}",
            "met": value is not None and value >= TARGET})
    r = figures["drain_ratios"]
    for case, state, peer in (("analyzed", "analyzed", "pgqueuer_analyzed"),
                              ("burst", BURST_STATE, "pgqueuer_burst")):
        ours = figures["states"].get(state, {}).get("drain_jobs_per_s")
        pgq = figures.get(peer, {})
        raw = figures["raw_floor"].get(state, {})
        when = ("after ANALYZE" if case == "analyzed" else
                f"burst, no ANALYZE for anyone (ours {state})")
        out += [
            {"name": f"9. drain / PgQueuer (psycopg), {when}: {ours} vs"
                     f" {pgq.get('jobs_per_s', pgq.get('error', 'not run'))} jobs/s ({shape})",
             "value": r[f"{case}_vs_pgqueuer"], "target": f">= {TARGET_VS_PGQUEUER:g}",
             "met": (r[f"{case}_vs_pgqueuer"] or 0) >= TARGET_VS_PGQUEUER},
            {"name": f"9. drain / raw claim-{RAW_BATCH} + ack floor (K={RAW_CLAIMERS}),"
                     f" {when}: {ours} vs {raw.get('jobs_per_s', raw.get('error'))} jobs/s",
             "value": r[f"{case}_vs_raw"], "target": f">= {TARGET_VS_RAW:g}",
             "met": (r[f"{case}_vs_raw"] or 0) >= TARGET_VS_RAW},
        ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--database-url", help="a server to use (default: an embedded one)")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-floor", action="store_true", help="skip the raw floor")
    ap.add_argument("--states", default=",".join(STATS_STATES),
                    help="statistics states to drain in (analyzed, the reference, first)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    states = tuple(args.states.split(","))
    if states[0] != "analyzed" or not set(states) <= set(STATS_STATES):
        ap.error(f"--states: 'analyzed' first, then any of {', '.join(STATS_STATES[1:])}")
    figures = collect(args.database_url, jobs=args.jobs, timeout_s=args.timeout,
                      peers=not args.no_peers, floor=not args.no_floor, states=states)
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
    for state, f in figures["raw_floor"].items():
        rows.append([f"raw floor {state}", f.get("jobs_per_s", f.get("error")), "", "", ""])
    print_table(["state", "drain runs/s", "vs analyzed", "server ms/run", "worker ms/run"],
                rows)
    for t in targets(figures):
        print(f"{t['name']}: {t['value']} (target {t['target']}, "
              f"{'met' if t['met'] else 'NOT met'})")


if __name__ == "__main__":
    main()
