"""The `runlease` command: server commands (server.py) and the HTTP API's
client commands (runs.py, dead.py, pools.py, sharing terminal.py), under one
group."""

from __future__ import annotations

from runlease.cli import actions, humans, run_commands
from runlease.cli.dead import dead
from runlease.cli.pools import pools
from runlease.cli.runs import runs
from runlease.cli.schedules import schedules
from runlease.cli.server import api, main, operator, run, worker
from runlease.cli.threads import threads
from runlease.cli.usage import usage
from runlease.cli.webhooks import children, webhooks

main.add_command(runs)
main.add_command(dead)
main.add_command(pools)
main.add_command(schedules)
main.add_command(threads)
main.add_command(usage)
main.add_command(webhooks)
runs.add_command(children)

__all__ = ["actions", "api", "humans", "main", "operator", "run", "run_commands", "worker"]
