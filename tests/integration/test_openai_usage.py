"""The OpenAI-compatible agent reports the stream's usage: summed on the run,
enforced against max_tokens, hostile counts left out."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from runlease.agents.openai import agent
from runlease.db.store import RunStore
from tests.integration.test_worker import finished, running_worker
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCall

API_KEY = "rlk-test-usage-5f6a7b8c9d0e"


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        monkeypatch.setenv("RUNLEASE_OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("RUNLEASE_OPENAI_MODEL", "fake-model")
        monkeypatch.setenv("RUNLEASE_OPENAI_API_KEY", API_KEY)
        yield server


def ask(text: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], "tools": ["sleep"]}


def nap(call_id: str) -> ToolCall:
    return ToolCall(call_id, "sleep", {"seconds": 0})


async def test_the_streams_usage_is_summed_on_the_run(
    live_store: RunStore, db_url: str, fake: FakeOpenAI
) -> None:
    fake.script(Reply(tool_calls=[nap("c1")], usage={"prompt_tokens": 20,
                                                     "completion_tokens": 5}),
                Reply(content="done", usage={"prompt_tokens": 30, "completion_tokens": 7}))
    queued = await live_store.enqueue("default", "acme", ask("hi"))
    async with running_worker(db_url, agent):
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    assert (run.input_tokens, run.output_tokens) == (50, 12)
    assert all(r.body["stream_options"] == {"include_usage": True} for r in fake.requests)


async def test_max_tokens_stops_the_agent_after_the_turn_that_passed_it(
    live_store: RunStore, db_url: str, fake: FakeOpenAI
) -> None:
    fake.script(*[Reply(tool_calls=[nap(f"c{i}")],
                        usage={"prompt_tokens": 40, "completion_tokens": 10})
                  for i in range(5)])
    queued = await live_store.enqueue("default", "acme", ask("loop"), max_attempts=3,
                                      budget={"max_tokens": 120})
    async with running_worker(db_url, agent):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts, run.error_code) == ("dead", 1, "budget_exceeded")
    assert len(fake.requests) == 3  # 50, 100, 150 > 120
    assert run.input_tokens + run.output_tokens == 150


async def test_hostile_usage_counts_are_left_out(
    live_store: RunStore, db_url: str, fake: FakeOpenAI
) -> None:
    fake.script(Reply(content="ok", usage={"prompt_tokens": -7, "completion_tokens": 10**15,
                                           "total_tokens": 10**15 - 7}))
    queued = await live_store.enqueue("default", "acme", ask("hi"))
    async with running_worker(db_url, agent):
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    assert (run.input_tokens, run.output_tokens) == (0, 0)
