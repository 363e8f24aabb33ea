"""What only a PydanticAI agent has, run by runlease (issue 30): deferred
tool calls answered by a person, a model named by its string. The tests
every library passes are in test_integration_agent_libraries.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from runlease.db.store import RunStore
from runlease.integrations import adapt
from tests.integration.test_worker import finished, running_worker
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCall
from tests.support.library_agents import PYDANTIC_AI, Library, fake, tool_log
from tests.support.waiting import until

__all__ = ["fake", "tool_log"]  # fixtures


@pytest.fixture
def lib() -> Library:
    return PYDANTIC_AI


async def test_an_external_call_waits_for_its_result_from_a_person(
    lib: Library, live_store: RunStore, db_url: str, fake: FakeOpenAI, tool_log: Path
) -> None:
    """A tool raising CallDeferred: the run waits for `result-<call id>`, and
    the answer is the tool's result the model gets."""
    fake.script(Reply(tool_calls=[ToolCall("m1", "ask_manager", {"question": "refund?"})]),
                Reply(content="The manager said yes."))
    queued = await live_store.enqueue("default", "acme", {"input": "Can I get a refund?"})
    async with running_worker(db_url, lib.agent()):
        async def waiting() -> bool:
            return (await live_store.get(queued.run.id)).status == "waiting"
        await until(waiting, what="the run to wait for the manager")
        assert await live_store.give_input(queued.run.id, "result-m1", "yes, refund it")
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.result_json["output"]) == ("done", "The manager said yes."), \
        run.error_message
    assert len(fake.requests) == 2
    tool = [m for m in fake.requests[1].body["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in tool] == [("m1", "yes, refund it")]


async def test_an_agent_built_with_an_openai_model_name_uses_the_runs_endpoint(
    live_store: RunStore, db_url: str, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent("openai-chat:<name>") makes its model (and its client) when it
    is built: the run asks the configured endpoint, under that model's name."""
    from pydantic_ai import Agent

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # what the import saw
    named = Agent("openai-chat:named-model", instructions="Be brief.")
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    fake.script(Reply(content="Hi."))
    adapted = adapt(named, "test:named")
    assert adapted is not None
    queued = await live_store.enqueue("default", "acme", {"input": "hello"})
    async with running_worker(db_url, adapted):
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    assert run.result_json["output"] == "Hi."
    assert [r.body["model"] for r in fake.requests] == ["named-model"]
