"""What issue 26's drain target asks of the CPU, and what each layer costs.

    python bench/ceiling.py [--database-url URL] [--jobs 20000] [--repeat 2] [--json]

Target 3 of issue 26 asks for a drain of no-op runs (two `runlease worker`
processes, concurrency 50) of at least 3x PgQueuer's and 0.5 of the raw
claim-50 + ack floor's, on the same server in the same run. A drain of
no-op runs is bound by CPU: every run costs the worker's Python and the
server's work for its claim and ack, and on one machine both share its
cores. So the rate a design can reach is at most

    cores / (worker CPU per run + server CPU per run)

This script measures, on one server in one run (alternated `--repeat`
times), the CPU per run of each layer and that bound:

- raw:    the seed's claim + ack on its own seven-column table (bench/claim.py
          `raw`, K=2 sync claimers, batch 50): the floor of the SQL;
- schema: the same two statements on runlease's agent_runs (its indexes,
          checks and triggers; bench/claim.py `schema`);
- store:  runlease's own claim and ack statements (the staged claim: fair
          order, caps, threads, fencing, counts) driven by a bare loop
          (bench/claim.py `store`), batch 25 as the drain's workers claim;
- drain:  the real drain (bench/throughput.py: two `runlease worker`, c=50);
- pgqueuer: PgQueuer draining as many jobs (bench/peers.py), when installed.

Client CPU is the claimer or worker processes' own (user + system); server
CPU is the postmaster's and its children's over the same span (a local
server only). The report then says what 3x PgQueuer leaves per run, against
what the server's floor alone already takes.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import claim  # bench/claim.py: its spawned claimers import it by name too
from benchlib import emit_json, fresh_database, machine, print_table, server, server_cpu_s
from claim import STATS_STATES
from throughput import TARGET_VS_PGQUEUER, drain_ours, note, run_peer, terminate_as_interrupt

CLAIMERS = 2
DRAIN_PROCESSES = 2
DRAIN_CONCURRENCY = 50
# The drain's workers claim half their slots at a time (settings/worker.py).
STORE_BATCH = DRAIN_CONCURRENCY // 2


def children_cpu_s() -> float:
    """CPU of this process's reaped children (the claimers, once joined)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sql_layer(url: str, kind: str, batch: int, jobs: int, stats: str) -> dict[str, Any]:
    """Jobs/s and CPU per job of one bench/claim.py claimer kind."""
    # claim.measure loads the table first: the CPU is read around the
    # claimers only, so the load is not charged to them.
    figures: dict[str, Any] = {}

    def on_start() -> None:
        figures["client0"] = children_cpu_s()
        figures["server0"] = server_cpu_s(url)

    rate = claim.measure(url, kind, CLAIMERS, batch, jobs, stats=stats, before_claim=on_start)
    client = (children_cpu_s() - figures["client0"]) * 1000 / jobs
    server_now = server_cpu_s(url)
    server_ms = ((server_now - figures["server0"]) * 1000 / jobs
                 if server_now is not None and figures["server0"] is not None else None)
    return {"jobs_per_s": round(rate, 1), "client_cpu_ms_per_run": round(client, 4),
            "server_cpu_ms_per_run": None if server_ms is None else round(server_ms, 4)}


def pgqueuer_layer(url: str, jobs: int, timeout_s: float) -> dict[str, Any]:
    before = server_cpu_s(url)
    result = run_peer("pgqueuer", url, jobs, timeout_s)
    after = server_cpu_s(url)
    if result.get("status") != "ok":
        return {"status": result.get("status")}
    worker_s = result.get("worker_cpu_s")
    # Its load is inside the span too (enqueue then drain); the server CPU
    # is an upper bound for the drain's.
    return {"jobs_per_s": result.get("jobs_per_s"),
            "client_cpu_ms_per_run": (round(worker_s * 1000 / jobs, 4)
                                      if worker_s is not None else None),
            "server_cpu_ms_per_run": (round((after - before) * 1000 / jobs, 4)
                                      if before is not None and after is not None else None),
            "server_cpu_includes_enqueue": True}


def bound(layer: dict[str, Any], cores: int) -> float | None:
    client, server_ms = layer.get("client_cpu_ms_per_run"), layer.get("server_cpu_ms_per_run")
    if client is None or server_ms is None or client + server_ms <= 0:
        return None
    return round(cores * 1000 / (client + server_ms), 1)


def collect(base: str | None, jobs: int, repeat: int, peers: bool,
            stats: str = "analyzed") -> dict[str, Any]:
    cores = os.cpu_count() or 1
    figures: dict[str, Any] = {"jobs": jobs, "cores": cores, "stats": stats,
                               "machine": machine(), "rounds": []}
    with server(base) as url0, tempfile.TemporaryDirectory(prefix="runlease-ceiling-") as tmp:
        url = fresh_database(url0, "runlease_bench_ceiling")
        for i in range(repeat):
            layers: dict[str, Any] = {}
            for kind, batch in (("raw", 50), ("schema", 50), ("store", STORE_BATCH)):
                layers[kind] = sql_layer(url, kind, batch, jobs, stats)
                note(f"round {i + 1}: {kind} {layers[kind]['jobs_per_s']} jobs/s")
            d = drain_ours(url, jobs, DRAIN_PROCESSES, DRAIN_CONCURRENCY, 600, Path(tmp),
                           stats=stats)
            layers["drain"] = {"jobs_per_s": d["drain_jobs_per_s"],
                               "client_cpu_ms_per_run": d["worker_cpu_ms_per_run"],
                               "server_cpu_ms_per_run": d["server_cpu_ms_per_run"]}
            note(f"round {i + 1}: drain {d['drain_jobs_per_s']} jobs/s")
            if peers:
                layers["pgqueuer"] = pgqueuer_layer(url, jobs, 600)
                note(f"round {i + 1}: pgqueuer {layers['pgqueuer'].get('jobs_per_s')}")
            for layer in layers.values():
                layer["cpu_bound_jobs_per_s"] = bound(layer, cores)
            figures["rounds"].append(layers)
    return figures


def budget(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Per round: what 3x PgQueuer leaves per run of CPU, and what the
    server's floors and our worker take of it."""
    out = []
    for layers in figures["rounds"]:
        pgq = layers.get("pgqueuer", {}).get("jobs_per_s")
        if not pgq:
            continue
        needed = TARGET_VS_PGQUEUER * pgq
        left_ms = figures["cores"] * 1000 / needed
        out.append({
            "pgqueuer_jobs_per_s": pgq,
            "needed_jobs_per_s": round(needed, 1),
            "cpu_ms_per_run_allowed": round(left_ms, 4),
            "raw_floor_server_ms": layers["raw"]["server_cpu_ms_per_run"],
            "schema_server_ms": layers["schema"]["server_cpu_ms_per_run"],
            "store_server_ms": layers["store"]["server_cpu_ms_per_run"],
            "drain_worker_ms": layers["drain"]["client_cpu_ms_per_run"],
            "drain_server_ms": layers["drain"]["server_cpu_ms_per_run"],
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-peers", action="store_true", help="skip PgQueuer")
    ap.add_argument("--stats", default="analyzed", choices=STATS_STATES,
                    help="what the planner knows when each load lands (bench/claim.py); "
                         "PgQueuer runs on its own freshly made tables either way")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with terminate_as_interrupt():
        figures = collect(args.database_url, args.jobs, args.repeat, not args.no_peers,
                          args.stats)
    figures["budget"] = budget(figures)
    if args.json:
        emit_json(figures)
        return
    rows = []
    for i, layers in enumerate(figures["rounds"], 1):
        for name, f in layers.items():
            rows.append([i, name, f.get("jobs_per_s"), f.get("client_cpu_ms_per_run"),
                         f.get("server_cpu_ms_per_run"), f.get("cpu_bound_jobs_per_s")])
    print(f"\n{figures['jobs']:,} no-op runs per layer, {figures['cores']} cores, "
          f"statistics {figures['stats']}\n")
    print_table(["round", "layer", "jobs/s", "client ms/run", "server ms/run",
                 "cores / CPU per run"], rows)
    print("\nwhat 3x PgQueuer leaves per run (CPU of worker + server, ms):")
    print_table(["PgQueuer", "3x", "allowed", "raw floor server", "schema server",
                 "store server", "drain worker", "drain server"],
                [[b["pgqueuer_jobs_per_s"], b["needed_jobs_per_s"],
                  b["cpu_ms_per_run_allowed"], b["raw_floor_server_ms"], b["schema_server_ms"],
                  b["store_server_ms"], b["drain_worker_ms"], b["drain_server_ms"]]
                 for b in figures["budget"]])


if __name__ == "__main__":
    main()
