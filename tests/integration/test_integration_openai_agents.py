"""What only an OpenAI Agents SDK agent has, run by runlease (issue 30):
handoffs. The tests every library passes are in
test_integration_agent_libraries.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from runlease.db.store import RunStore
from runlease.integrations import adapt
from tests.integration.test_worker import finished, running_worker
from tests.support import openai_agents_app
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCall
from tests.support.library_agents import OPENAI_AGENTS, Library, fake, lines, tool_log

__all__ = ["fake", "tool_log"]  # fixtures


@pytest.fixture
def lib() -> Library:
    return OPENAI_AGENTS


async def test_the_tools_of_an_agent_handed_off_to_are_steps_too(
    live_store: RunStore, db_url: str, fake: FakeOpenAI, tool_log: Path
) -> None:
    from agents import Agent, handoff

    weather = Agent(name="weather", instructions="Weather.", tools=[openai_agents_app.lookup])
    triage = Agent(name="triage", instructions="Route.", handoffs=[weather])
    transfer = handoff(weather).tool_name
    fake.script(
        Reply(tool_calls=[ToolCall("h1", transfer, {})]),
        Reply(tool_calls=[ToolCall("c1", "lookup", {"city": "Oslo"})]),
        Reply(content="Sunny in Oslo."),
    )
    adapted = adapt(triage, "test:triage")
    assert adapted is not None
    queued = await live_store.enqueue("default", "acme", {"input": "Weather in Oslo?"})
    async with running_worker(db_url, adapted):
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    assert (run.result_json["final_output"], run.result_json["last_agent"]) == (
        "Sunny in Oslo.", "weather")
    assert lines(tool_log) == ["lookup Oslo"]
    assert "tool-2-c1" in await live_store.get_steps(run.id)
    assert [e.data["name"] for e in await live_store.events_after(run.id)
            if e.kind == "tool.call"] == ["lookup"]
