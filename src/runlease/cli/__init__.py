"""The `runlease` command: server commands (server.py) and the HTTP API's
client commands (runs.py, dead.py, pools.py, sharing terminal.py), under one
group."""

from __future__ import annotations

from runlease.cli import run_commands
from runlease.cli.dead import dead
from runlease.cli.pools import pools
from runlease.cli.runs import runs
from runlease.cli.server import api, main, operator, run, worker

main.add_command(runs)
main.add_command(dead)
main.add_command(pools)

__all__ = ["api", "main", "operator", "run", "run_commands", "worker"]
