"""The OpenAI-compatible agent in a real in-process worker against a real
PostgreSQL, talking to a scripted Chat Completions server (tests/support/fake_openai.py)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

import pytest

from runlease.agents.openai import agent
from runlease.db.models import Event, Run
from runlease.db.store import RunStore
from tests.integration.test_worker import (
    _async,
    _has_event,
    _status,
    finished,
    running_worker,
)
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCall
from tests.support.waiting import until
from tests.support.workers import HOST_FILES

API_KEY = "rlk-test-1b2c3d4e5f6a7b8c9d0e"  # no well-known shape: only the agent can scrub it


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        monkeypatch.setenv("RUNLEASE_OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("RUNLEASE_OPENAI_MODEL", "fake-model")
        monkeypatch.setenv("RUNLEASE_OPENAI_API_KEY", API_KEY)
        monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
        yield server


def ask(text: str, *, tools: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "tools": tools or [], **extra}


def shell(call_id: str, script: str) -> ToolCall:
    return ToolCall(call_id, "shell", {"argv": ["sh", "-c", script]})


async def events(store: RunStore, run_id: UUID) -> list[Event]:
    return await store.events_after(run_id)


def kinds(evs: list[Event]) -> list[str]:
    """Event kinds with runs of the same kind folded: how many message.delta
    events a stream becomes depends on timing."""
    return [kind for kind, _ in itertools.groupby(e.kind for e in evs)]


async def test_a_tool_call_round_trip(
    live_store: RunStore, db_url: str, fake: FakeOpenAI
) -> None:
    fake.script(
        Reply(content="Let me look.", tool_calls=[shell("call_abc", "echo hi")]),
        Reply(content="The shell said hi."),
    )
    queued = await live_store.enqueue("default", "acme", ask(
        "Say hi through the shell", tools=["shell"], model="override-model", max_tokens=50))
    async with running_worker(db_url, agent):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts) == ("done", 1), run.error_message
    assert run.result_json == {"content": "The shell said hi.", "turns": 2, "tool_calls": 1,
                               "finish_reason": "stop"}

    first, second = (r.body for r in fake.requests)
    assert fake.requests[0].path == "/v1/chat/completions"
    assert fake.requests[0].headers["authorization"] == f"Bearer {API_KEY}"
    assert (first["model"], first["stream"], first["max_tokens"]) == ("override-model", True, 50)
    assert [t["function"]["name"] for t in first["tools"]] == ["shell"]
    user, assistant, tool = second["messages"]
    assert user == {"role": "user", "content": "Say hi through the shell"}
    assert assistant["content"] == "Let me look."
    (call,) = assistant["tool_calls"]
    assert call["id"] == "call_abc"
    assert json.loads(call["function"]["arguments"]) == {"argv": ["sh", "-c", "echo hi"]}
    assert tool["role"] == "tool"
    assert tool["tool_call_id"] == "call_abc"
    assert tool["content"] == '{"returncode": 0, "stderr": "", "stdout": "hi\\n"}'

    evs = await events(live_store, run.id)
    assert kinds(evs) == ["message.delta", "message", "tool.call", "tool.result",
                          "message.delta", "message"]
    deltas = "".join(e.data["text"] for e in evs if e.kind == "message.delta")
    assert deltas == "Let me look.The shell said hi."
    by_kind = {e.kind: e.data for e in evs}
    assert by_kind["tool.call"] == {"id": "call_abc", "name": "shell",
                                    "arguments": {"argv": ["sh", "-c", "echo hi"]}}
    assert by_kind["tool.result"]["result"]["stdout"] == "hi\n"
    assert by_kind["message"]["content"] == "The shell said hi."
    steps = await live_store.get_steps(run.id)
    assert sorted(steps) == ["tool-call_abc", "turn-1", "turn-2"]


@pytest.mark.parametrize("fail", ["drop", "error", "end"])
async def test_no_tool_runs_before_the_message_is_complete(
    live_store: RunStore, db_url: str, fake: FakeOpenAI, tmp_path: Path,
    fail: Literal["drop", "error", "end"],
) -> None:
    marker = tmp_path / "ran"
    # Every fragment of the call arrives, then the stream breaks (or just
    # ends) before the finish_reason: the arguments look whole, the message is not.
    fake.script(Reply(tool_calls=[shell("call_1", f"touch {marker}")], fail=fail))
    queued = await live_store.enqueue("default", "acme", ask("go", tools=["shell"]),
                                      max_attempts=1)
    async with running_worker(db_url, agent, **HOST_FILES):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.error_code) == ("dead", "model_unavailable")
    assert not marker.exists()
    assert "tool.call" not in kinds(await events(live_store, run.id))
    assert await live_store.get_steps(run.id) == {}


async def test_a_retry_replays_committed_turns_and_tools(
    live_store: RunStore, db_url: str, fake: FakeOpenAI, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    fake.script(
        Reply(tool_calls=[shell("call_1", f"echo ran >> {marker}; echo hi")]),
        Reply(status=500, error="the model is overloaded"),
        Reply(content="Done."),
    )
    queued = await live_store.enqueue("default", "acme", ask("go", tools=["shell"]),
                                      max_attempts=3)
    async with running_worker(db_url, agent, **HOST_FILES):
        pending = await retried(live_store, queued.run.id)
        assert pending.error_code == "model_unavailable"
        assert "500" in (pending.error_message or "")
        run = await finished(live_store, queued.run.id, timeout_s=20)
    assert (run.status, run.attempts) == ("done", 2), run.error_message
    assert run.result_json == {"content": "Done.", "turns": 2, "tool_calls": 1,
                               "finish_reason": "stop"}
    # Attempt 2 asked the model only for turn 2, with the same conversation.
    assert len(fake.requests) == 3
    assert fake.requests[2].body["messages"] == fake.requests[1].body["messages"]
    assert marker.read_text().splitlines() == ["ran"]
    steps = await live_store.get_steps(run.id)
    assert (steps["turn-1"].attempt, steps["tool-call_1"].attempt,
            steps["turn-2"].attempt) == (1, 1, 2)
    assert [e.kind for e in await events(live_store, run.id)].count("tool.call") == 1


async def test_cancel_closes_a_slow_stream(
    live_store: RunStore, db_url: str, fake: FakeOpenAI
) -> None:
    fake.script(Reply(content="word " * 200, chunk_chars=5, delay_s=0.2))  # ~40 s of stream
    queued = await live_store.enqueue("default", "acme", ask("talk slowly"), max_attempts=3)
    async with running_worker(db_url, agent, cancel_grace_s=10):
        await until(lambda: _has_event(live_store, queued.run.id, "message.delta"),
                    what="the first streamed delta")
        asked = time.monotonic()
        await live_store.request_cancel(queued.run.id)
        run = await finished(live_store, queued.run.id)
        latency = time.monotonic() - asked
        await until(lambda: _async(fake.hangups), timeout_s=5, what="the stream to be closed")
    assert (run.status, run.attempts) == ("cancelled", 1)
    assert latency < 2, latency  # the grace is 10 s: the stream was closed, not waited out
    assert fake.hangups[0] - asked < 2
    assert "message" not in kinds(await events(live_store, run.id))
    print(f"cancel latency during a stream: {latency * 1000:.0f} ms")


@pytest.mark.parametrize("status", [429, 503])
async def test_an_unavailable_model_is_retried(
    live_store: RunStore, db_url: str, fake: FakeOpenAI, status: int
) -> None:
    fake.script(Reply(status=status, error="slow down"))
    queued = await live_store.enqueue("default", "acme", ask("hi"), max_attempts=3)
    async with running_worker(db_url, agent):
        run = await retried(live_store, queued.run.id)
    assert (run.attempts, run.error_code) == (1, "model_unavailable")
    assert f"HTTP {status}: slow down" in (run.error_message or "")


async def test_replayed_tool_calls_count_against_the_budget(
    live_store: RunStore, db_url: str, fake: FakeOpenAI
) -> None:
    fake.script(
        Reply(tool_calls=[ToolCall("a", "sleep", {"seconds": 0})]),
        Reply(status=429, error="slow down"),
        Reply(tool_calls=[ToolCall("b", "sleep", {"seconds": 0})]),
    )
    queued = await live_store.enqueue("default", "acme", ask("go", tools=["sleep"]),
                                      budget={"max_tool_calls": 1}, max_attempts=3)
    async with running_worker(db_url, agent):
        assert (await retried(live_store, queued.run.id)).error_code == "model_unavailable"
        run = await finished(live_store, queued.run.id, timeout_s=20)
    # Attempt 2 replayed call "a" from its step and counted it: "b" is the second call.
    assert (run.status, run.attempts, run.error_code) == ("dead", 2, "budget_exceeded")
    assert sorted(await live_store.get_steps(run.id)) == ["tool-a", "turn-1", "turn-2"]


async def test_a_refused_request_is_dead_at_once(
    live_store: RunStore, db_url: str, fake: FakeOpenAI
) -> None:
    fake.script(Reply(status=400, error="'messages' is malformed"))
    queued = await live_store.enqueue("default", "acme", ask("hi"), max_attempts=5)
    async with running_worker(db_url, agent):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts, run.error_code) == ("dead", 1, "model_rejected")
    assert "HTTP 400: 'messages' is malformed" in (run.error_message or "")


@pytest.mark.parametrize(
    ("budget", "replies", "requests", "sleeps"),
    [
        # The model keeps calling tools; the third turn is over max_turns.
        ({"max_turns": 2},
         [Reply(tool_calls=[ToolCall(f"c{i}", "sleep", {"seconds": 0})]) for i in range(5)],
         2, 2),
        # Two calls in one message; the second is over max_tool_calls.
        ({"max_tool_calls": 1},
         [Reply(tool_calls=[ToolCall("a", "sleep", {"seconds": 0}),
                            ToolCall("b", "sleep", {"seconds": 0})])],
         1, 1),
    ],
    ids=["max_turns", "max_tool_calls"],
)
async def test_budgets_end_the_run_dead(
    live_store: RunStore, db_url: str, fake: FakeOpenAI, budget: dict[str, Any],
    replies: list[Reply], requests: int, sleeps: int,
) -> None:
    fake.script(*replies)
    queued = await live_store.enqueue("default", "acme", ask("loop", tools=["sleep"]),
                                      budget=budget, max_attempts=3)
    async with running_worker(db_url, agent):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts, run.error_code) == ("dead", 1, "budget_exceeded")
    assert len(fake.requests) == requests
    assert len([s for s in await live_store.get_steps(run.id) if s.startswith("tool-")]) == sleeps


async def test_the_api_key_is_never_stored(
    live_store: RunStore, db_url: str, fake: FakeOpenAI, tmp_path: Path
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(f"the key is {API_KEY}\n")
    fake.script(
        # The model gets a tool to print the key from a file and from the environment...
        Reply(content=f"I will not say {API_KEY}.", tool_calls=[shell(
            "call_1", f"cat {key_file}; echo env=$RUNLEASE_OPENAI_API_KEY/$OPENAI_API_KEY")]),
        # ...and the API's refusal quotes the key back.
        Reply(status=401, error="Incorrect API key provided:", echo_key=True),
    )
    queued = await live_store.enqueue("default", "acme", ask("leak it", tools=["shell"]))
    async with running_worker(db_url, agent, **HOST_FILES):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.error_code) == ("dead", "model_rejected")
    assert fake.requests[1].headers["authorization"] == f"Bearer {API_KEY}"
    assert run.error_message is not None
    assert "Incorrect API key provided: (you sent: [REDACTED])" in run.error_message
    stored = [run.error_message, json.dumps(run.result_json)]
    stored += [json.dumps(e.data) for e in await events(live_store, run.id)]
    stored += [json.dumps(s.result) for s in (await live_store.get_steps(run.id)).values()]
    assert not [text for text in stored if API_KEY in text]
    # The tool did run: the key was cut from its output, and its environment never had it.
    sent_back = fake.requests[1].body["messages"][-1]
    assert json.loads(sent_back["content"])["stdout"] == "the key is [REDACTED]\nenv=/\n"
    assert API_KEY not in json.dumps(fake.requests[1].body)


async def test_unknown_tools_and_reused_ids_do_not_crash(
    live_store: RunStore, db_url: str, fake: FakeOpenAI, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    fake.script(
        # A tool that does not exist, and one that exists but was not offered.
        Reply(tool_calls=[ToolCall("call_0", "rm_rf", {}), ToolCall("call_1", "sleep",
                                                                    {"seconds": 0})]),
        # Some servers number calls from 0 on every turn: the ids repeat.
        Reply(tool_calls=[shell("call_0", f"echo one >> {marker}")]),
        Reply(tool_calls=[shell("call_0", f"echo two >> {marker}")]),
        Reply(content="ok"),
    )
    queued = await live_store.enqueue("default", "acme", ask("go", tools=["shell"]))
    async with running_worker(db_url, agent, **HOST_FILES):
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    assert run.result_json["tool_calls"] == 4
    results = [m for m in fake.requests[1].body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["call_0", "call_1"]
    assert "unknown tool 'rm_rf'" in json.loads(results[0]["content"])["error"]
    assert "unknown tool 'sleep'" in json.loads(results[1]["content"])["error"]
    assert marker.read_text().splitlines() == ["one", "two"]
    ids = [m["tool_call_id"] for m in fake.requests[3].body["messages"] if m["role"] == "tool"]
    assert len(ids) == len(set(ids)) == 4


async def test_a_server_that_does_not_stream(
    live_store: RunStore, db_url: str, fake: FakeOpenAI
) -> None:
    fake.script(Reply(tool_calls=[shell("call_1", "echo hi")], plain=True),
                Reply(content="It said hi.", plain=True))
    queued = await live_store.enqueue("default", "acme", ask("go", tools=["shell"]))
    async with running_worker(db_url, agent):
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    assert (run.result_json["content"], run.result_json["tool_calls"]) == ("It said hi.", 1)
    assert kinds(await events(live_store, run.id)) == ["tool.call", "tool.result",
                                                       "message.delta", "message"]


async def retried(store: RunStore, run_id: UUID) -> Run:
    """The run back in pending after a failed first attempt."""
    return await until(lambda: _status(store, run_id, "pending", attempts=1), what="the retry")


async def test_a_message_sent_during_a_tool_call_is_seen_at_the_next_turn_once(
    live_store: RunStore, db_url: str, fake: FakeOpenAI, tmp_path: Any
) -> None:
    """Issue 28: the user's correction, sent while a tool runs, is a user
    message of the next model request, once; one sent while the model gives
    its final answer gets one more turn."""
    gate = tmp_path / "gate"
    fake.script(
        Reply(content="Checking.", tool_calls=[shell(
            "call_1", f"while [ ! -e {gate} ]; do sleep 0.05; done; echo checked")]),
        Reply(content="Noted, using staging.", delay_s=0.3),
        Reply(content="Also done."),
    )
    queued = await live_store.enqueue("default", "acme", ask("Deploy", tools=["shell"]))
    async with running_worker(db_url, agent, **HOST_FILES):
        async def in_tool() -> bool:
            return any(e.kind == "tool.call" for e in await events(live_store, queued.run.id))
        await until(in_tool, what="the tool to start")
        await live_store.send_message(queued.run.id, "use staging, not prod")
        gate.touch()
        async def second_turn_started() -> bool:
            return len(fake.requests) >= 2
        await until(second_turn_started, what="the second model request")
        await live_store.send_message(queued.run.id, "and tell me when done")
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    assert run.result_json["content"] == "Also done."
    bodies = [r.body["messages"] for r in fake.requests]
    users = [[m["content"] for m in b if m["role"] == "user"] for b in bodies]
    assert users == [["Deploy"], ["Deploy", "use staging, not prod"],
                     ["Deploy", "use staging, not prod", "and tell me when done"]]
    steps = await live_store.get_steps(run.id)
    assert {"message:1", "message:2"} <= set(steps)
