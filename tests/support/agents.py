"""Agents for the worker tests, importable by worker subprocesses as
`tests.support.agents:<name>`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from runlease.worker import FatalError, RetryableError, RunContext

# What agent code that copies the environment at import sees: the worker
# imports its agent before it seals its secrets away (worker/toolenv.py).
ENVIRON_AT_IMPORT = dict(os.environ)


async def echo(ctx: RunContext) -> dict[str, Any]:
    await ctx.emit("message", {"text": "hello"})
    return {"input": ctx.input, "attempt": ctx.attempt}


async def retry_once(ctx: RunContext) -> dict[str, Any]:
    if ctx.attempt < 2:
        raise RetryableError("the model API is flaky", code="model_unavailable")
    return {"attempt": ctx.attempt}


async def crash(ctx: RunContext) -> None:
    raise ValueError("could not connect to postgresql://app:hunter2secret@db/x "
                     "with key sk-abcdefghijklmnopqrstuvwx " + "y" * 10_000)


async def fatal(ctx: RunContext) -> None:
    raise FatalError("the request was refused", code="refused")


async def too_many_turns(ctx: RunContext) -> None:
    while True:
        await ctx.begin_turn()


async def too_many_tools(ctx: RunContext) -> None:
    while True:
        await ctx.run_tool(["true"])


async def sleepy(ctx: RunContext) -> dict[str, Any]:
    """Sleeps input.seconds, waking on a Stop; records that it started."""
    await ctx.emit("started", {"attempt": ctx.attempt})
    await ctx.sleep(float(ctx.input.get("seconds", 60)))
    return {"slept": True}


async def stubborn(ctx: RunContext) -> None:
    """Ignores the cancel token; only task cancellation stops it."""
    await ctx.emit("started", {})
    await asyncio.sleep(3600)


async def counted_steps(ctx: RunContext) -> dict[str, Any]:
    """Two durable steps, each appending to input.log when it executes; fails
    after the first step on attempt 1."""
    log = Path(ctx.input["log"])

    async def work(name: str) -> dict[str, Any]:
        line = f"{name} attempt={ctx.attempt}\n"
        def append() -> None:
            with log.open("a") as f:
                f.write(line)

        await asyncio.to_thread(append)
        return {"name": name, "attempt": ctx.attempt}

    first = await ctx.step("first", lambda: work("first"))
    if ctx.attempt == 1:
        raise RetryableError("fail between the steps")
    second = await ctx.step("second", lambda: work("second"))
    return {"first": first, "second": second}


async def ticker(ctx: RunContext) -> dict[str, Any]:
    """A tool that appends "<attempt> <unix time>" to input.path every 50 ms:
    for a minute on attempt 1, for one second later."""
    seconds = 60 if ctx.attempt == 1 else 1
    path = ctx.input["path"]
    script = (f'end=$(( $(date +%s) + {seconds} )); '
              f'while [ "$(date +%s)" -lt "$end" ]; do '
              f'echo "{ctx.attempt} $(date +%s.%N)" >> {path}; sleep 0.05; done')
    await ctx.run_tool(["sh", "-c", script])
    return {"attempt": ctx.attempt}


async def environ_tool(ctx: RunContext) -> dict[str, Any]:
    """Hands a tool the worker's whole environment, as careless agent code
    would (a copy made at import, and os.environ now), plus a variable of its
    own and one that smuggles the database URL; returns what the tool saw."""
    env = {**ENVIRON_AT_IMPORT, **os.environ, "AGENT_SET": "set-by-the-agent",
           "SMUGGLED": "db=" + ENVIRON_AT_IMPORT.get("RUNLEASE_DATABASE_URL", "")}
    result = await ctx.run_tool(["env"], env=env)
    return {"env": result.stdout}


async def family(ctx: RunContext) -> dict[str, Any]:
    """A parent (input.children = n) submits n children in its tenant and
    waits for them; a child sleeps input.sleep and returns its index."""
    if "children" not in ctx.input:
        await ctx.emit("started", {"i": ctx.input["i"]})
        await ctx.sleep(float(ctx.input.get("sleep", 0.05)))
        return {"child": ctx.input["i"]}
    ids = [await ctx.submit_child({"i": i, "sleep": ctx.input.get("sleep", 0.05)})
           for i in range(int(ctx.input["children"]))]
    outcomes = await ctx.wait_children()
    return {"ids": ids, "attempt": ctx.attempt, "statuses": [o["status"] for o in outcomes],
            "children": sorted(o["result"]["child"] for o in outcomes if o["result"])}


async def slow_first(ctx: RunContext) -> dict[str, Any]:
    """Sleeps a minute on attempt 1 (for a kill -9 to interrupt), returns at
    once on later attempts."""
    if ctx.attempt == 1:
        await ctx.emit("started", {"attempt": ctx.attempt})
        await ctx.sleep(60)
    return {"attempt": ctx.attempt}
