"""An OpenAI Agents SDK agent for the adapter's tests, loaded by real worker
processes with `--agent tests.support.openai_agents_app:agent`.

Its tools append a line to the file named by ADAPTER_TEST_LOG each time they
run (the count the tests read); `book` first waits for the file named by
ADAPTER_TEST_GATE, when that is set, so a test can kill the worker between
two tool calls.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from agents import Agent, function_tool


def record(line: str) -> None:
    log = os.environ.get("ADAPTER_TEST_LOG")
    if log:
        with Path(log).open("a") as out:
            out.write(line + "\n")


@function_tool
async def lookup(city: str) -> str:
    """The weather in a city."""
    record(f"lookup {city}")
    return f"sunny in {city}"


@function_tool
async def book(city: str) -> dict[str, str]:
    """Book a trip to a city."""
    record(f"book-start {city}")
    gate = os.environ.get("ADAPTER_TEST_GATE")
    # The gate is a file another process creates: polled, without blocking the loop long.
    while gate and not Path(gate).exists():  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.05)
    record(f"book {city}")
    return {"booked": city}


@function_tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file (a person approves each call)."""
    record(f"delete {path}")
    return f"deleted {path}"


agent = Agent(name="travel", instructions="You book trips.", tools=[lookup, book, delete_file])


@function_tool
async def run_command(script: str) -> str:
    """Run a shell script on the worker (a process whose group a Stop kills)."""
    from runlease.integrations.running import run_context

    result = await run_context().run_tool(["sh", "-c", script], timeout_s=120)
    return result.stdout


agent.tools.append(run_command)
