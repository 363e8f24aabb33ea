"""The `runlease` command: server commands (server.py) and the HTTP API's
client commands (client.py), under one group."""

from __future__ import annotations

from runlease.cli import actions, run_commands
from runlease.cli.client import dead, pools, runs
from runlease.cli.schedules import schedules
from runlease.cli.server import api, main, operator, run, worker

main.add_command(runs)
main.add_command(dead)
main.add_command(pools)
main.add_command(schedules)

__all__ = ["actions", "api", "main", "operator", "run", "run_commands", "worker"]
