"""Agents for the benchmarks, importable by worker subprocesses as
`bench.agents:<name>` (with the repository root on PYTHONPATH).

They use only the public RunContext API, like any agent would.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from runlease.worker import RunContext


async def noop(ctx: RunContext) -> None:
    """Does nothing (returns None): what is left is the queue's own cost per run."""


async def stamp(ctx: RunContext) -> dict[str, Any]:
    """Returns the wall-clock instant the agent started (time.time(), this
    machine's clock), stored as the run's result by the ack."""
    return {"started": time.time()}


async def sleeper(ctx: RunContext) -> None:
    """Cooperative: sleeps input.seconds (default 60) via ctx.sleep, which
    wakes with RunCancelled as soon as the run is cancelled."""
    await ctx.sleep(float(ctx.input.get("seconds", 60)))


async def marked_sleeper(ctx: RunContext) -> None:
    """Leaves a file named after the run in input.mark_dir the moment it
    starts, before its first await (so an agent whose task was cancelled
    before it ever ran leaves none), then sleeps like `sleeper`."""
    (Path(ctx.input["mark_dir"]) / str(ctx.run_id)).write_text(repr(time.time()))
    await ctx.sleep(float(ctx.input.get("seconds", 60)))
