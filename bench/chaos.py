"""Crash and restart, end to end, for longer than CI allows.

    python bench/chaos.py [--runs 600] [--chaos-s 120] [--db-restarts 3]
                          [--stop-mode fast|immediate] [--quiet-outage] [--json]

The harness of tests/integration/test_chaos.py (tests/support/chaos.py; its
docstring says what is run and how each figure is judged): its own embedded
PostgreSQL (durable, stopped with `pg_ctl -m <--stop-mode>` and started again
on the same port and data directory `--db-restarts` times, evenly spaced),
the real `runlease api` process, `--workers` `runlease worker` processes of
the script agent, runs submitted through the API over the first 60 % of
`--chaos-s`, a kill -9 of a random worker every `--kill-every-s` (0.5x-1.5x,
random) with a replacement started at once. Prints the figures; asserts
nothing, but exits 1 when an invariant figure is not zero.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness is in tests/support
from benchlib import emit_json, machine, print_table

from tests.support.chaos import Chaos, ChaosConfig

INVARIANTS = ("lost", "overlapping_leases", "attempts_over_max", "event_seq_gaps",
              "orphaned_tools", "api_errors_after_restart", "streams_broken", "worker_exits")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    defaults = ChaosConfig(runs=600, chaos_s=120, db_restarts=3)
    for f in fields(ChaosConfig):
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            parser.add_argument("--" + f.name.replace("_", "-"), default=default,
                                action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument("--" + f.name.replace("_", "-"), type=type(default),
                                default=default)
    parser.add_argument("--work-dir", type=Path, help="logs of every process (a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    config = ChaosConfig(**{f.name: getattr(args, f.name) for f in fields(ChaosConfig)})
    chaos = Chaos(config, args.work_dir)
    figures = chaos.run()
    failed = [name for name in INVARIANTS if getattr(figures, name)]
    if args.json:
        emit_json({"config": asdict(config), "figures": asdict(figures), "machine": machine(),
                   "failed": failed, "work_dir": str(chaos.dir)})
    else:
        print(f"config: {asdict(config)}")
        print(f"logs: {chaos.dir}")
        print_table(["figure", "value"], figures.table())
        if failed:
            print(f"\nINVARIANTS BROKEN: {', '.join(failed)} (logs in {chaos.dir})")
            for key in ("statuses", "overlaps", "orphans", "api_errors_after_restart",
                        "streams_broken"):
                print(f"  {key}: {figures.details.get(key)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
