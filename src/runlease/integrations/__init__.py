"""Agents written with other libraries, run as runlease runs unchanged (issue 30).

`runlease worker --agent myapp.agents:support_agent` names either an async
function taking a RunContext, or an agent object of a supported library,
which is adapted here into one:

    OpenAI Agents SDK   an `agents.Agent`                 runlease.integrations.openai_agents
    PydanticAI          a `pydantic_ai.Agent`             runlease.integrations.pydantic_ai
    LangGraph           a compiled graph (`Pregel`)       runlease.integrations.langgraph

Each adapter is an optional extra (`pip install 'runlease[openai-agents]'`,
`[pydantic-ai]`, `[langgraph]`), imported only when an object of its library
is named: the core never imports these libraries. The object's type's module
says which library it comes from, so adapting imports nothing it does not need.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from runlease.errors import SettingsError

if TYPE_CHECKING:
    from runlease.worker import RunContext

Agent = Callable[[Any], Awaitable[Any]]

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

# The library's top-level package (of the object's type) -> its adapter module.
ADAPTERS = {
    "agents": "runlease.integrations.openai_agents",
    "pydantic_ai": "runlease.integrations.pydantic_ai",
    "langgraph": "runlease.integrations.langgraph",
}


def library_of(obj: object) -> str | None:
    """The supported library `obj` is an object of (by its type's module), or None."""
    for cls in type(obj).__mro__:
        root = (cls.__module__ or "").split(".", 1)[0]
        if root in ADAPTERS:
            return root
    return None


def adapt(obj: object, spec: str) -> Agent | None:
    """An agent for `obj` if it is a supported library's agent; None if it is
    not. SettingsError when the adapter is missing (the extra not installed)."""
    library = library_of(obj)
    if library is None:
        return None
    try:
        module = importlib.import_module(ADAPTERS[library])
    except ImportError as exc:
        raise SettingsError(f"{spec} is a {library} object, but its adapter cannot be "
                            f"imported: {exc}") from None
    agent: Agent = module.adapt(obj)
    return agent
