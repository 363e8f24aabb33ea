"""LangGraph graphs for tests/integration/test_integration_langgraph.py, run
by real `runlease worker --agent tests.support.langgraph_graphs:<name>`
processes. Each node appends its name to the file the input names (`log`),
so a test counts how often each ran; `gate` names a file a node waits for.
"""

from __future__ import annotations

import asyncio
import operator
import os
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt


class State(TypedDict, total=False):
    log: str
    gate: str
    done: Annotated[list[str], operator.add]
    answer: Any


def _record(state: State, name: str) -> None:
    with Path(state["log"]).open("a") as f:
        f.write(name + "\n")


async def _wait_for(path: str) -> None:
    # A file another process makes: polled (no event to wait on), in a thread.
    while not await asyncio.to_thread(os.path.exists, path):  # noqa: ASYNC110
        await asyncio.sleep(0.05)


async def first(state: State) -> dict[str, Any]:
    _record(state, "first")
    return {"done": ["first"]}


async def second(state: State) -> dict[str, Any]:
    _record(state, "second-started")
    if state.get("gate"):
        await _wait_for(state["gate"])
    _record(state, "second")
    return {"done": ["second"]}


async def slow(state: State) -> dict[str, Any]:
    _record(state, "slow-started")
    await asyncio.sleep(600)
    _record(state, "slow-finished")
    return {"done": ["slow"]}


async def process(state: State) -> dict[str, Any]:
    """A tool process through the run's context: a Stop ends its group."""
    from runlease.integrations.running import run_context

    _record(state, "process-started")
    pidfile = Path(state["log"]).with_name("pid")
    await run_context().run_tool(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 600"])
    _record(state, "process-finished")
    return {"done": ["process"]}


async def ask(state: State) -> dict[str, Any]:
    _record(state, "ask")
    answer = interrupt({"prompt": "Ship it?", "schema": {"type": "boolean"}})
    _record(state, f"answered-{answer}")
    return {"answer": answer, "done": ["ask"]}


def _two(name_a: str, a: Any, name_b: str, b: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node(name_a, a)
    builder.add_node(name_b, b)
    builder.add_edge(START, name_a)
    builder.add_edge(name_a, name_b)
    builder.add_edge(name_b, END)
    return builder.compile()


two_nodes = _two("first", first, "second", second)
slow_graph = _two("first", first, "slow", slow)
approval = _two("first", first, "ask", ask)
process_graph = _two("first", first, "process", process)
# A graph whose second node is a subgraph that asks: its checkpoints are in a
# namespace of their own.
nested = _two("first", first, "inner", _two("inner_first", first, "ask", ask))


# A model and two tools: ChatOpenAI against the scripted server whose URL is
# in LANGGRAPH_TEST_OPENAI_URL; each tool appends to LANGGRAPH_TEST_LOG.
def _tool_log(line: str) -> None:
    with Path(os.environ["LANGGRAPH_TEST_LOG"]).open("a") as f:
        f.write(line + "\n")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    _tool_log(f"add {a} {b}")
    return a + b


@tool
def shout(text: str) -> str:
    """Say it louder."""
    gate = os.environ.get("LANGGRAPH_TEST_GATE")
    if gate:  # a sync tool runs in a thread of its own: it may block
        _tool_log(f"shout-started {text}")
        while not Path(gate).exists():
            time.sleep(0.05)
    _tool_log(f"shout {text}")
    return text.upper() + "!"


_models: dict[str, Any] = {}


def _model(url: str) -> Any:
    """The model for the scripted server at `url`, made once: importing
    langchain_openai and making a client blocks the event loop for seconds
    on a busy machine, longer than the tests' 2 s leases."""
    if url not in _models:
        from langchain_openai import ChatOpenAI

        _models[url] = ChatOpenAI(model="scripted", api_key="sk-test-not-a-secret",  # type: ignore[arg-type]
                                  base_url=url, max_retries=0,
                                  stream_usage=True).bind_tools([add, shout])
    return _models[url]


if "LANGGRAPH_TEST_OPENAI_URL" in os.environ:  # a worker process: made before any claim
    _model(os.environ["LANGGRAPH_TEST_OPENAI_URL"])


async def model(state: MessagesState) -> dict[str, list[BaseMessage]]:
    reply = await _model(os.environ["LANGGRAPH_TEST_OPENAI_URL"]).ainvoke(state["messages"])
    assert isinstance(reply, AIMessage)
    return {"messages": [reply]}


_chat = StateGraph(MessagesState)
_chat.add_node("model", model)
_chat.add_node("tools", ToolNode([add, shout]))
_chat.add_edge(START, "model")
_chat.add_conditional_edges("model", tools_condition)
_chat.add_edge("tools", "model")
chat = _chat.compile()
