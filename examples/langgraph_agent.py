"""A small LangGraph agent, run by runlease as it is (docs/agents.md, LangGraph):

    pip install 'runlease[langgraph]' langchain-openai
    RUNLEASE_OPENAI_BASE_URL=https://api.openai.com/v1 RUNLEASE_OPENAI_MODEL=gpt-4o-mini \\
    OPENAI_API_KEY=... runlease worker --agent examples.langgraph_agent:graph --pool default

then submit `{"messages": [{"role": "user", "content": "Count the words of 'ship it now'
and publish the count as 'Word count'"}]}`. The model calls `word_count`, then
`publish`, which asks a person first (`interrupt()`): the run waits, holding no
worker slot, until someone answers `true` or `false` (POST /v1/runs/{id}/input,
`runlease runs input`, the console's Approve/Deny). Kill the worker at any point:
the run resumes from its last checkpoint on another worker.

Any OpenAI-compatible endpoint serves: RUNLEASE_OPENAI_BASE_URL (else
OPENAI_BASE_URL, which `runlease dev --agent` sets to its scripted model when
no model is configured), RUNLEASE_OPENAI_MODEL, RUNLEASE_OPENAI_API_KEY or
OPENAI_API_KEY, read from the environment the worker started with (the
worker takes secrets out of its own os.environ at start).
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt
from pydantic import SecretStr

from runlease.worker.toolenv import worker_environ


@tool
def word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


@tool
def publish(title: str, body: str) -> str:
    """Publish a note; a person approves it first."""
    approved = interrupt({"prompt": f"Publish {title!r}?\n\n{body}",
                          "schema": {"type": "boolean"}})
    return f"published {title!r}" if approved else "the reviewer said no: not published"


TOOLS = [word_count, publish]


_chat: list[object] = []  # the model, made on first use and kept: a client is costly


def chat_model() -> Any:
    if not _chat:
        from langchain_openai import ChatOpenAI  # the model's package, for this example only

        env = worker_environ()
        key = env.get("RUNLEASE_OPENAI_API_KEY") or env.get("OPENAI_API_KEY") or "none"
        _chat.append(ChatOpenAI(
            base_url=env.get("RUNLEASE_OPENAI_BASE_URL") or env.get("OPENAI_BASE_URL")
            or "https://api.openai.com/v1",
            model=env.get("RUNLEASE_OPENAI_MODEL", "gpt-4o-mini"),
            api_key=SecretStr(key),  # "none": a local server that wants no key
            stream_usage=True,
        ).bind_tools(TOOLS))
    return _chat[0]


async def model(state: MessagesState) -> dict[str, list[Any]]:
    return {"messages": [await chat_model().ainvoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("model", model)
builder.add_node("tools", ToolNode(TOOLS))
builder.add_edge(START, "model")
builder.add_conditional_edges("model", tools_condition)
builder.add_edge("tools", "model")
graph = builder.compile()
