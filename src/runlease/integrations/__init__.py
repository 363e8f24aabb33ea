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
A library agent's tool or a graph's node reaches the run through
runlease.integrations.running.run_context(). This module imports nothing of
the worker: the settings, which the operator reads too, import it.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any

from runlease.errors import SettingsError

Agent = Callable[[Any], Awaitable[Any]]

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
