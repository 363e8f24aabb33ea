"""The run an adapted agent is running (runlease.integrations), for the code
the library calls: a tool of an Agents SDK or PydanticAI agent, a node of a
LangGraph graph.

    from runlease.integrations.running import run_context

    async def publish(title: str) -> str:
        result = await run_context().run_tool(["./publish.sh", title])
        ...
"""

from __future__ import annotations

from contextvars import ContextVar

from runlease.worker import RunContext

# The run whose adapted agent is running, in the agent's task and the tasks
# it starts (a library's tool calls): one for every adapter.
_current: ContextVar[RunContext | None] = ContextVar("runlease_run", default=None)


def run_context() -> RunContext:
    """The RunContext of the run whose agent is calling, from a library
    agent's tool or a graph's node: `await run_context().run_tool(["make",
    "test"])` runs a process the worker sandboxes and whose whole group a
    Stop kills; `run_context().step(key, fn)` is a durable step. LookupError
    outside a run."""
    ctx = _current.get()
    if ctx is None:
        raise LookupError("run_context() is for code that a runlease worker runs "
                          "(a library agent's tool, a graph's node)")
    return ctx


def bind(ctx: RunContext) -> None:
    """The adapter's agent task runs `ctx`'s run: run_context() answers it
    there and in every task started from it (set in the agent's own task,
    so the binding ends with it)."""
    _current.set(ctx)
