"""What the tests of library agents (issue 30) share: the two libraries
whose agents run unchanged on the Chat Completions endpoint (the OpenAI
Agents SDK, PydanticAI), the scripted server's fixture, the tools' log and
the two-tool script. tests/integration/test_integration_agent_libraries.py
runs each test once per library; what only one library has is tested in
its own module, whose `lib` fixture names it."""

from __future__ import annotations

import importlib
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runlease.db.models import Event
from runlease.integrations import adapt
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCall

USAGE = {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}


@dataclass(frozen=True)
class Library:
    name: str
    app: str  # module:object of the test agent (tests/support/*_app.py)
    api_key: str
    output: str  # the result's key of the agent's final output
    dict_result: str  # what the model is given for a tool that returned {"booked": "Oslo"}
    check_result: Callable[[dict[str, Any]], None]  # the rest of the result's shape

    def agent(self) -> Any:
        module, _, name = self.app.partition(":")
        adapted = adapt(getattr(importlib.import_module(module), name), self.app)
        assert adapted is not None
        return adapted


def _agents_result(result: dict[str, Any]) -> None:
    assert result["last_agent"] == "travel"
    assert [i.get("type") for i in result["items"]][-1] == "message"


def _pydantic_result(result: dict[str, Any]) -> None:
    kinds_of = [m["kind"] for m in result["new_messages"]]
    assert kinds_of == ["request", "response", "request", "response", "request", "response"]


OPENAI_AGENTS = Library(
    "openai_agents", "tests.support.openai_agents_app:agent", "rlk-agents-1b2c3d4e5f6a7b8c9d0e",
    "final_output",
    # (the SDK gives the model a tool's dict as its str())
    "{'booked': 'Oslo'}", _agents_result)
PYDANTIC_AI = Library(
    "pydantic_ai", "tests.support.pydantic_ai_app:agent", "rlk-pydantic-1b2c3d4e5f6a7b8c9d0e",
    "output", '{"booked":"Oslo"}', _pydantic_result)
LIBRARIES = (OPENAI_AGENTS, PYDANTIC_AI)


@pytest.fixture
def tool_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "tools.log"
    monkeypatch.setenv("ADAPTER_TEST_LOG", str(log))
    return log


@pytest.fixture
async def fake(lib: Library, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("RUNLEASE_OPENAI_MODEL", "fake-model")
        monkeypatch.setenv("OPENAI_API_KEY", lib.api_key)
        yield server


def kinds(evs: list[Event]) -> list[str]:
    return [kind for kind, _ in itertools.groupby(e.kind for e in evs)]


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


TWO_TOOLS = (
    Reply(content="Let me look.", tool_calls=[ToolCall("c1", "lookup", {"city": "Oslo"})],
          usage=USAGE),
    Reply(tool_calls=[ToolCall("c2", "book", {"city": "Oslo"})], usage=USAGE),
    Reply(content="Booked Oslo, sunny.", usage=USAGE),
)
