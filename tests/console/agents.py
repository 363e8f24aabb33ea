"""The agent of the console's browser tests, importable by a worker
subprocess as `tests.console.agents:agent`: the script agent, plus model
tokens streamed as deltas and a failure that ends once a file exists."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from runlease.agents import script
from runlease.worker import FatalError, RunContext


async def agent(ctx: RunContext) -> dict[str, Any]:
    """input.tokens: streamed as message.delta events, input.pause_s apart,
    then a tool call and result; input.fail_until_file: dead (fatal) while
    that file does not exist; then the script agent's input.steps."""
    gate = ctx.input.get("fail_until_file")
    if gate is not None and not await asyncio.to_thread(Path(str(gate)).exists):
        raise FatalError(f"waiting for {gate}: not there yet", code="gate_closed")
    tokens = ctx.input.get("tokens") or []
    pause = float(ctx.input.get("pause_s", 0.2))
    for token in tokens:
        await ctx.delta(str(token))
        await ctx.sleep(pause)
    if tokens:
        await ctx.flush()
        await ctx.emit("tool.call", {"id": "call-1", "name": "search",
                                     "arguments": {"q": "runlease"}})
        await ctx.emit("tool.result", {"id": "call-1", "name": "search",
                                       "result": {"hits": 3}})
    return await script.agent(ctx)
