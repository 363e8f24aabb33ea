"""Agents of the OpenAI Agents SDK and of PydanticAI run by runlease (issue
30), each test once per library: the real `agents` and `pydantic_ai`
packages, a real PostgreSQL, in-process and real worker processes, and a
scripted Chat Completions server (tests/support/fake_openai.py). What only
one library has is tested in test_integration_openai_agents.py and
test_integration_pydantic_ai.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runlease.db.store import RunStore
from tests.integration.test_worker import _async, _has_event, finished, running_worker
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCall
from tests.support.library_agents import (
    LIBRARIES,
    TWO_TOOLS,
    Library,
    fake,
    kinds,
    lines,
    tool_log,
)
from tests.support.proc import WorkerProcess
from tests.support.waiting import until
from tests.support.workers import HOST_FILES

__all__ = ["fake", "tool_log"]  # fixtures


@pytest.fixture(params=LIBRARIES, ids=lambda lib: lib.name)
def lib(request: pytest.FixtureRequest) -> Library:
    library: Library = request.param
    return library


async def test_a_two_tool_run_end_to_end(
    lib: Library, live_store: RunStore, db_url: str, fake: FakeOpenAI, tool_log: Path
) -> None:
    fake.script(*TWO_TOOLS)
    queued = await live_store.enqueue("default", "acme", {"input": "Book me a sunny trip"})
    async with running_worker(db_url, lib.agent()):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts) == ("done", 1), run.error_message
    assert run.result_json[lib.output] == "Booked Oslo, sunny."
    lib.check_result(run.result_json)
    assert lines(tool_log) == ["lookup Oslo", "book-start Oslo", "book Oslo"]

    # The model got the tools' results back, under their call ids.
    assert len(fake.requests) == 3
    assert fake.requests[0].headers["authorization"] == f"Bearer {lib.api_key}"
    assert fake.requests[0].body["model"] == "fake-model"
    last = fake.requests[2].body["messages"]
    assert {"role": "tool", "tool_call_id": "c1", "content": "sunny in Oslo"} in last
    assert {"role": "tool", "tool_call_id": "c2", "content": lib.dict_result} in last

    evs = await live_store.events_after(run.id)
    assert [k for k in kinds(evs) if not k.startswith("run.")] == [
        "message.delta", "message", "tool.call", "tool.result", "tool.call", "tool.result",
        "message.delta", "message"]
    calls = [e.data for e in evs if e.kind == "tool.call"]
    assert calls == [{"id": "c1", "name": "lookup", "arguments": {"city": "Oslo"}},
                     {"id": "c2", "name": "book", "arguments": {"city": "Oslo"}}]
    results = [e.data["result"] for e in evs if e.kind == "tool.result"]
    assert results == ["sunny in Oslo", {"booked": "Oslo"}]
    assert "".join(e.data["text"] for e in evs if e.kind == "message.delta") == \
        "Let me look.Booked Oslo, sunny."
    steps = await live_store.get_steps(run.id)
    assert sorted(steps) == ["inbox-3", "model-1", "model-2", "model-3", "tool-1-c1",
                             "tool-2-c2"]
    assert (run.input_tokens, run.output_tokens, run.turns_used,
            run.tool_calls_used) == (33, 15, 3, 2)
    assert all(r.body["stream_options"] == {"include_usage": True} for r in fake.requests)
    stored = [json.dumps(e.data) for e in evs] + [json.dumps(s.result) for s in steps.values()]
    assert not [s for s in stored if lib.api_key in s]


async def test_two_calls_in_one_response_are_two_steps(
    lib: Library, live_store: RunStore, db_url: str, fake: FakeOpenAI, tool_log: Path
) -> None:
    """The library runs the calls of one response side by side: each is its
    own step, and both results reach the model."""
    fake.script(
        Reply(tool_calls=[ToolCall("c1", "lookup", {"city": "Oslo"}),
                          ToolCall("c2", "lookup", {"city": "Bergen"})]),
        Reply(content="Both sunny."),
    )
    queued = await live_store.enqueue("default", "acme", {"input": "Oslo and Bergen?"})
    async with running_worker(db_url, lib.agent()):
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    assert sorted(lines(tool_log)) == ["lookup Bergen", "lookup Oslo"]
    steps = await live_store.get_steps(run.id)
    assert {"tool-1-c1", "tool-1-c2"} <= set(steps)
    assert run.tool_calls_used == 2
    results = {m["tool_call_id"]: m["content"] for m in fake.requests[1].body["messages"]
               if m["role"] == "tool"}
    assert results == {"c1": "sunny in Oslo", "c2": "sunny in Bergen"}


@pytest.mark.parametrize(("status", "code", "outcome"),
                         [(500, "model_unavailable", "done"), (400, "model_rejected", "dead")])
async def test_a_failed_request_is_retried_from_the_committed_steps(
    lib: Library, live_store: RunStore, db_url: str, fake: FakeOpenAI, tool_log: Path, status: int,
    code: str, outcome: str,
) -> None:
    """A 5xx ends the attempt retryable; the next attempt replays the first
    request and the tool call, and asks only the failed request again. A 4xx
    is dead at once."""
    fake.script(
        Reply(tool_calls=[ToolCall("c1", "lookup", {"city": "Oslo"})]),
        Reply(status=status, error="the model is overloaded", echo_key=True),
        Reply(content="Done."),
    )
    queued = await live_store.enqueue("default", "acme", {"input": "go"}, max_attempts=3)
    async with running_worker(db_url, lib.agent()):
        run = await finished(live_store, queued.run.id, timeout_s=30)
    assert run.status == outcome, run.error_message
    assert lines(tool_log) == ["lookup Oslo"]
    if outcome == "dead":
        assert (run.attempts, run.error_code) == (1, code)
        assert f"HTTP {status}" in (run.error_message or "")
        assert lib.api_key not in (run.error_message or "")
        assert "[REDACTED]" in (run.error_message or "")
        return
    assert run.attempts == 2
    assert len(fake.requests) == 3
    assert fake.requests[2].body["messages"] == fake.requests[1].body["messages"]
    steps = await live_store.get_steps(run.id)
    assert (steps["model-1"].attempt, steps["tool-1-c1"].attempt,
            steps["model-2"].attempt) == (1, 1, 2)


async def test_a_max_turns_budget_ends_the_run(
    lib: Library, live_store: RunStore, db_url: str, fake: FakeOpenAI, tool_log: Path
) -> None:
    fake.script(*TWO_TOOLS)
    queued = await live_store.enqueue("default", "acme", {"input": "go"},
                                      budget={"max_turns": 2}, max_attempts=3)
    async with running_worker(db_url, lib.agent()):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts, run.error_code) == ("dead", 1, "budget_exceeded")
    assert len(fake.requests) == 2


async def test_cancel_stops_a_model_stream_at_once(
    lib: Library, live_store: RunStore, db_url: str, fake: FakeOpenAI, tool_log: Path
) -> None:
    fake.script(Reply(content="word " * 200, chunk_chars=5, delay_s=0.2))  # ~40 s of stream
    queued = await live_store.enqueue("default", "acme", {"input": "talk"}, max_attempts=3)
    async with running_worker(db_url, lib.agent(), cancel_grace_s=10):
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
    assert await live_store.get_steps(run.id) == {}
    print(f"cancel latency during a model stream: {latency * 1000:.0f} ms")


async def test_cancel_kills_the_process_group_of_a_tools_command(
    lib: Library, live_store: RunStore, db_url: str, fake: FakeOpenAI, tool_log: Path,
    tmp_path: Path,
) -> None:
    """A tool that runs a process through run_context().run_tool: a Stop
    kills its whole group (the child it started in the background too)."""
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait"
    fake.script(Reply(tool_calls=[ToolCall("c1", "run_command", {"script": script})]))
    queued = await live_store.enqueue("default", "acme", {"input": "run it"}, max_attempts=3)
    async with running_worker(db_url, lib.agent(), cancel_grace_s=10, **HOST_FILES):
        async def started() -> bool:
            return pids.exists() and len(pids.read_text().split()) == 2
        await until(started, what="the tool's processes to start")
        asked = time.monotonic()
        await live_store.request_cancel(queued.run.id)
        run = await finished(live_store, queued.run.id)
        latency = time.monotonic() - asked
    assert (run.status, run.attempts) == ("cancelled", 1)
    assert latency < 5, latency  # the grace is 10 s: the tool was stopped, not waited out
    print(f"cancel latency during a tool's command: {latency * 1000:.0f} ms")

    def gone() -> bool:
        return not [p for p in pids.read_text().split() if Path(f"/proc/{p}").exists()
                    and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1][:3]]
    await until(lambda: _async(gone()), what="the tool's processes to be gone", timeout_s=10)
    assert "tool-1-c1" not in await live_store.get_steps(run.id)


async def test_an_approval_parks_the_run_and_the_answer_resumes_it(
    lib: Library, live_store: RunStore, db_url: str, fake: FakeOpenAI, tool_log: Path
) -> None:
    fake.script(
        Reply(tool_calls=[ToolCall("d1", "delete_file", {"path": "/tmp/x"})]),
        Reply(content="Deleted it."),
        Reply(tool_calls=[ToolCall("d2", "delete_file", {"path": "/etc/passwd"})]),
        Reply(content="I was not allowed."),
    )
    async with running_worker(db_url, lib.agent()):
        outcomes = []
        for text, name, answer in (("delete /tmp/x", "approve-d1", True),
                                   ("delete /etc/passwd", "approve-d2", False)):
            queued = await live_store.enqueue("default", "acme", {"input": text})

            async def waiting(run_id: Any = queued.run.id) -> bool:
                return (await live_store.get(run_id)).status == "waiting"
            await until(waiting, what="the run to wait for its approval")
            parked = await live_store.get(queued.run.id)
            assert (parked.locked_by, parked.attempts) == (None, 0)
            assert lines(tool_log) == (["delete /tmp/x"] if not answer else [])
            assert await live_store.give_input(queued.run.id, name, answer)
            outcomes.append(await finished(live_store, queued.run.id))
    run, denied = outcomes
    assert (run.status, run.result_json[lib.output]) == ("done", "Deleted it."), \
        run.error_message
    assert (denied.status, denied.result_json[lib.output]) == ("done", "I was not allowed.")
    assert lines(tool_log) == ["delete /tmp/x"]
    # Each model request was made once: the resumed attempts replayed the first.
    assert len(fake.requests) == 4
    results = [m["content"] for r in (fake.requests[1], fake.requests[3])
               for m in r.body["messages"] if m["role"] == "tool"]
    assert results[0] == "deleted /tmp/x"
    assert results[1] != "deleted /etc/passwd"
    print("the model was told, of the denied call:", results[1])
    evs = await live_store.events_after(run.id)
    assert [e.data["name"] for e in evs if e.kind == "tool.call"] == ["delete_file"]
    assert "tool.call" not in [e.kind for e in await live_store.events_after(denied.id)]


async def test_a_message_reaches_the_agent_at_its_next_turn(
    lib: Library, live_store: RunStore, db_url: str, fake: FakeOpenAI, tool_log: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = tmp_path / "gate"
    monkeypatch.setenv("ADAPTER_TEST_GATE", str(gate))
    fake.script(
        Reply(tool_calls=[ToolCall("c1", "book", {"city": "Oslo"})]),
        Reply(content="Booked Oslo, with a window seat."),
    )
    queued = await live_store.enqueue("default", "acme", {"input": "Book Oslo"})
    async with running_worker(db_url, lib.agent()):
        await until(lambda: _has_event(live_store, queued.run.id, "tool.call"),
                    what="the tool to start")
        await live_store.send_message(queued.run.id, "a window seat, please")
        gate.touch()
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    users = [[m["content"] for m in r.body["messages"] if m["role"] == "user"]
             for r in fake.requests]
    assert users == [["Book Oslo"], ["Book Oslo", "a window seat, please"]]


async def test_a_message_during_the_final_answer_gets_one_more_run(
    lib: Library, live_store: RunStore, db_url: str, fake: FakeOpenAI, tool_log: Path
) -> None:
    fake.script(Reply(content="Booked nothing yet, " * 5, delay_s=0.1),
                Reply(content="Noted: Bergen instead."))
    queued = await live_store.enqueue("default", "acme", {"input": "Book Oslo"})
    async with running_worker(db_url, lib.agent()):
        await until(lambda: _has_event(live_store, queued.run.id, "message.delta"),
                    what="the answer to stream")
        await live_store.send_message(queued.run.id, "make it Bergen")
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    assert len(fake.requests) == 2
    users = [[m["content"] for m in r.body["messages"] if m["role"] == "user"]
             for r in fake.requests]
    assert users == [["Book Oslo"], ["Book Oslo", "make it Bergen"]]
    steps = await live_store.get_steps(run.id)
    assert {"message:1", "inbox-1", "inbox-2"} <= set(steps)


@pytest.mark.parametrize("given", [{}, {"input": 5}, {"input": ""}, {"input": ["x"]},
                                   {"input": "hi", "max_turns": 0},
                                   {"message_history": [{"kind": "bogus"}]}])
async def test_bad_input_is_dead_at_once(
    lib: Library, live_store: RunStore, db_url: str, fake: FakeOpenAI, given: dict[str, Any]
) -> None:
    queued = await live_store.enqueue("default", "acme", given, max_attempts=3)
    async with running_worker(db_url, lib.agent()):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts, run.error_code) == ("dead", 1, "bad_input"), \
        run.error_message
    assert fake.requests == []


# -- real worker processes -----------------------------------------------------------------


FAST = {"lease_s": 2, "heartbeat_interval_s": 0.5, "poll_interval_s": 0.5,
        "reaper_interval_s": 0.5, "leader_ttl_s": 2}


@pytest.fixture
def workers(lib: Library, db_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(name: str, **env: str) -> WorkerProcess:
        process = WorkerProcess(db_url, tmp_path, name, {"agent": lib.app, **FAST})
        process.env.update(env)
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.cleanup()


@pytest.mark.slow
async def test_kill_9_between_two_tool_calls_replays_the_first(
    lib: Library, live_store: RunStore, fake: FakeOpenAI, tool_log: Path, tmp_path: Path,
    workers: Any,
) -> None:
    """The worker dies (kill -9) while the second tool runs; the next attempt,
    on another worker process, does not call the first tool or the first two
    model requests again."""
    gate = tmp_path / "gate"
    env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": lib.api_key,
           "ADAPTER_TEST_LOG": str(tool_log), "ADAPTER_TEST_GATE": str(gate)}
    fake.script(*TWO_TOOLS)
    queued = await live_store.enqueue("default", "acme", {"input": "Book me a trip"},
                                      max_attempts=3)
    first = workers("w1", **env)

    async def in_second_tool() -> bool:
        return "book-start Oslo" in lines(tool_log)
    await until(in_second_tool, what="the second tool call to start", timeout_s=60)
    first.kill9()
    gate.touch()
    workers("w2", **env)
    run = await finished(live_store, queued.run.id, timeout_s=60)
    assert (run.status, run.attempts) == ("done", 2), run.error_message
    assert run.result_json[lib.output] == "Booked Oslo, sunny."
    # The first tool ran once; the second was cut by the kill and ran again.
    assert lines(tool_log) == ["lookup Oslo", "book-start Oslo", "book-start Oslo", "book Oslo"]
    assert len(fake.requests) == 3  # no model request was made twice
    steps = await live_store.get_steps(run.id)
    assert (steps["model-1"].attempt, steps["tool-1-c1"].attempt, steps["model-2"].attempt,
            steps["tool-2-c2"].attempt, steps["model-3"].attempt) == (1, 1, 1, 2, 2)
    evs = await live_store.events_after(run.id)
    assert [e.data["id"] for e in evs if e.kind == "tool.result"] == ["c1", "c2"]
