"""LangGraph graphs as runlease runs (issue 30): runlease.integrations.langgraph
against real PostgreSQL and real langgraph, in an in-process worker and in
real `runlease worker` processes (kill -9). The graphs are in
tests/support/langgraph_graphs.py; their nodes and tools count what they ran
in a file."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from runlease.clock import ManualClock
from runlease.db.checkpoints import MAX_CHECKPOINT_BYTES
from runlease.db.connect import make_conn_pool
from runlease.db.models import Lease
from runlease.db.store import NewRun, RunStore
from runlease.errors import LeaseLost, ValidationError
from runlease.integrations import langgraph as adapter
from tests.integration.test_worker import finished
from tests.support import langgraph_graphs as graphs
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCall
from tests.support.proc import WorkerProcess
from tests.support.waiting import until
from tests.support.workers import HOST_FILES, running_worker

GRAPHS = "tests.support.langgraph_graphs"
FAST = {"lease_s": 2, "heartbeat_interval_s": 0.5, "poll_interval_s": 0.5,
        "reaper_interval_s": 0.5, "leader_ttl_s": 2, **HOST_FILES}


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def kinds(store: RunStore, run_id: UUID) -> list[str]:
    return [e.kind for e in await store.events_after(run_id)]


async def status_is(store: RunStore, run_id: UUID, status: str) -> bool:
    return (await store.get(run_id)).status == status


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(name: str, graph: str, **settings: Any) -> WorkerProcess:
        process = WorkerProcess(db_url, tmp_path, name,
                                FAST | {"agent": f"{GRAPHS}:{graph}"} | settings).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.cleanup()


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        monkeypatch.setenv("LANGGRAPH_TEST_OPENAI_URL", server.base_url)
        monkeypatch.setenv("LANGGRAPH_TEST_LOG", str(tmp_path / "tools.log"))
        yield server


# -- end to end -------------------------------------------------------------------


async def test_a_two_node_graph_runs_to_its_result(live_store: RunStore, db_url: str,
                                                    tmp_path: Path) -> None:
    log = tmp_path / "log"
    queued = await live_store.enqueue("default", "acme", {"input": {"log": str(log)}})
    async with running_worker(db_url, adapter.adapt(graphs.two_nodes)):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts) == ("done", 1), run.error_message
    assert lines(log) == ["first", "second-started", "second"]
    assert run.result_json is not None
    assert run.result_json["values"]["done"] == ["first", "second"]
    assert run.result_json["thread_id"] == str(run.id)
    # Its checkpoints are the run's, in its tenant.
    latest = await live_store.get_graph_checkpoint("acme", f"run:{run.id}", "")
    assert latest is not None
    assert (latest.run_id, latest.checkpoint_id) == (run.id, run.result_json["checkpoint_id"])
    assert await live_store.get_graph_checkpoint("other", f"run:{run.id}", "") is None


async def test_a_model_with_two_tools_streams_its_tokens_and_tool_events(
    live_store: RunStore, db_url: str, fake: FakeOpenAI, tmp_path: Path
) -> None:
    usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    fake.script(
        Reply(content="Adding first.", tool_calls=[ToolCall("call_add", "add", {"a": 2, "b": 3})],
              usage=usage),
        Reply(tool_calls=[ToolCall("call_shout", "shout", {"text": "five"})], usage=usage),
        Reply(content="It is FIVE!, the sum of two and three.", usage=usage),
    )
    queued = await live_store.enqueue("default", "acme", {
        "messages": [{"role": "user", "content": "add 2 and 3, then shout it"}]})
    async with running_worker(db_url, adapter.adapt(graphs.chat)):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts) == ("done", 1), run.error_message
    assert run.result_json is not None
    assert run.result_json["output"] == "It is FIVE!, the sum of two and three."
    assert [m["type"] for m in run.result_json["messages"]] == [
        "human", "ai", "tool", "ai", "tool", "ai"]
    assert lines(tmp_path / "tools.log") == ["add 2 3", "shout five"]
    events = await live_store.events_after(run.id)
    deltas = "".join(e.data["text"] for e in events if e.kind == "message.delta")
    assert "It is FIVE!, the sum of two and three." in deltas
    calls = [e.data for e in events if e.kind == "tool.call"]
    results = [e.data for e in events if e.kind == "tool.result"]
    assert [(c["id"], c["name"], c["arguments"]) for c in calls] == [
        ("call_add", "add", {"a": 2, "b": 3}), ("call_shout", "shout", {"text": "five"})]
    assert [(r["id"], r["result"]) for r in results] == [("call_add", "5"),
                                                          ("call_shout", "FIVE!")]
    spent = await live_store.run_usage(run.id)
    assert (spent.input_tokens, spent.output_tokens, spent.turns, spent.tool_calls) == (
        33, 21, 3, 2)
    # The third request carried both tool results back to the model.
    tool_messages = [m for m in fake.requests[2].body["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["5", "FIVE!"]


async def test_a_message_sent_while_the_graph_runs_starts_one_more_pass(
    live_store: RunStore, db_url: str, fake: FakeOpenAI
) -> None:
    """A chat graph: a message that came while the model answered is given
    to the graph as a user message once the pass ends, and answered."""
    fake.script(Reply(content="First answer.", delay_s=0.3, chunk_chars=2),
                Reply(content="Noted: in French."))
    queued = await live_store.enqueue("default", "acme", {
        "messages": [{"role": "user", "content": "hello"}]})
    async with running_worker(db_url, adapter.adapt(graphs.chat)):
        async def answering() -> bool:
            return "message.delta" in await kinds(live_store, queued.run.id)
        await until(answering, what="the model to start answering")
        await live_store.send_message(queued.run.id, "answer in French")
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts) == ("done", 1), run.error_message
    assert run.result_json is not None
    assert [(m["type"], m["content"]) for m in run.result_json["messages"]] == [
        ("human", "hello"), ("ai", "First answer."), ("human", "answer in French"),
        ("ai", "Noted: in French.")]
    assert len(fake.requests) == 2


async def test_a_thread_s_runs_continue_one_graph_state(live_store: RunStore, db_url: str,
                                                       tmp_path: Path) -> None:
    """Runs of one runlease thread share the graph's thread: the second run
    starts from the state the first left (its `done` list grows on)."""
    log = tmp_path / "log"
    ids = []
    for _ in range(2):
        async with live_store.connection() as conn, conn.transaction():
            out = await live_store.submit_to_thread(
                "default", NewRun("acme", {"input": {"log": str(log)}}), "chat-7", conn=conn)
        ids.append(out.result.run.id)
    async with running_worker(db_url, adapter.adapt(graphs.two_nodes)):
        first, second = [await finished(live_store, i) for i in ids]
    assert (first.status, second.status) == ("done", "done"), second.error_message
    assert first.result_json is not None
    assert second.result_json is not None
    assert first.result_json["values"]["done"] == ["first", "second"]
    assert second.result_json["values"]["done"] == ["first", "second", "first", "second"]
    assert second.result_json["thread_id"] == "chat-7"
    # Another tenant's thread of the same name is another graph thread.
    assert await live_store.get_graph_checkpoint("acme", "thread:chat-7", "") is not None
    assert await live_store.get_graph_checkpoint("other", "thread:chat-7", "") is None


async def test_model_turns_count_against_the_budget(live_store: RunStore, db_url: str,
                                                    fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(Reply(tool_calls=[ToolCall("call_add", "add", {"a": 1, "b": 1})]),
                Reply(content="two"))
    queued = await live_store.enqueue("default", "acme", {
        "messages": [{"role": "user", "content": "1+1"}]}, budget={"max_turns": 1})
    async with running_worker(db_url, adapter.adapt(graphs.chat)):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.error_code) == ("dead", "budget_exceeded")
    assert len(fake.requests) == 1
    assert lines(tmp_path / "tools.log") == ["add 1 1"]


@pytest.mark.parametrize("limit", [0, 10**9, "25", True])
async def test_a_hostile_recursion_limit_ends_the_run(live_store: RunStore, db_url: str,
                                                      tmp_path: Path, limit: Any) -> None:
    queued = await live_store.enqueue("default", "acme", {
        "input": {"log": str(tmp_path / "log")}, "recursion_limit": limit})
    async with running_worker(db_url, adapter.adapt(graphs.two_nodes)):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.error_code) == ("dead", "invalid_input")
    assert lines(tmp_path / "log") == []


# -- durability: kill -9, cancel, interrupt ------------------------------------------


async def test_a_killed_worker_s_run_resumes_after_the_committed_node(
    db_url: str, workers: Any, tmp_path: Path
) -> None:
    """The first node's step is committed, the worker is killed in the
    second; another worker resumes from the checkpoint: `first` ran once,
    `second` again (at least once: it had not finished)."""
    log, gate = tmp_path / "log", tmp_path / "gate"
    async with make_conn_pool(db_url, max_size=4) as pool:
        store = RunStore(pool)
        first = workers("w1", "two_nodes")
        run = (await store.enqueue("default", "acme", {
            "input": {"log": str(log), "gate": str(gate)}})).run

        async def in_second() -> bool:
            return "second-started" in lines(log)
        await until(in_second, what="the second node to start", timeout_s=30)
        first.kill9()
        gate.touch()
        workers("w2", "two_nodes")
        done = await finished(store, run.id, timeout_s=60)
    assert (done.status, done.attempts) == ("done", 2), done.error_message
    assert lines(log) == ["first", "second-started", "second-started", "second"]
    assert done.result_json is not None
    assert done.result_json["values"]["done"] == ["first", "second"]


async def test_a_killed_worker_s_run_calls_no_committed_model_request_or_tool_again(
    db_url: str, workers: Any, fake: FakeOpenAI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model asked for `add` (done, its result committed), then for
    `shout`; the worker dies inside `shout`. The next worker neither asks the
    model its first two questions again nor calls `add` again: it runs
    `shout` (unfinished), then asks the model for its final answer."""
    gate = tmp_path / "gate"
    monkeypatch.setenv("LANGGRAPH_TEST_GATE", str(gate))
    fake.script(
        Reply(tool_calls=[ToolCall("call_add", "add", {"a": 2, "b": 3})]),
        Reply(tool_calls=[ToolCall("call_shout", "shout", {"text": "five"})]),
        Reply(content="FIVE!"),
    )
    tools_log = tmp_path / "tools.log"
    async with make_conn_pool(db_url, max_size=4) as pool:
        store = RunStore(pool)
        first = workers("w1", "chat")
        run = (await store.enqueue("default", "acme", {
            "messages": [{"role": "user", "content": "add, then shout"}]})).run

        async def in_shout() -> bool:
            return "shout-started five" in lines(tools_log)
        await until(in_shout, what="the second tool to start", timeout_s=30)
        first.kill9()
        gate.touch()
        workers("w2", "chat")
        done = await finished(store, run.id, timeout_s=60)
        calls = [e.data["id"] for e in await store.events_after(run.id)
                 if e.kind == "tool.call"]
    assert (done.status, done.attempts) == ("done", 2), done.error_message
    assert done.result_json is not None
    assert done.result_json["output"] == "FIVE!"
    assert lines(tools_log) == ["add 2 3", "shout-started five", "shout-started five",
                                "shout five"]
    assert len(fake.requests) == 3
    assert calls == ["call_add", "call_shout", "call_shout"]


async def test_a_stop_ends_a_model_stream_at_once(live_store: RunStore, db_url: str,
                                                  fake: FakeOpenAI) -> None:
    fake.script(Reply(content="a very slow answer " * 50, chunk_chars=1, delay_s=0.2))
    queued = await live_store.enqueue("default", "acme", {
        "messages": [{"role": "user", "content": "talk slowly"}]})
    async with running_worker(db_url, adapter.adapt(graphs.chat), cancel_grace_s=120):
        async def streaming() -> bool:
            return "message.delta" in await kinds(live_store, queued.run.id)
        await until(streaming, what="the model's stream to start")
        await live_store.request_cancel(queued.run.id)
        run = await finished(live_store, queued.run.id, timeout_s=20)
    assert run.status == "cancelled"
    assert len(fake.requests) == 1


async def test_a_stop_ends_a_slow_node_at_once(live_store: RunStore, db_url: str,
                                               tmp_path: Path) -> None:
    """The worker's grace is long (120 s): only the adapter's own watch on
    the Stop can end the run before the test's wait runs out."""
    log = tmp_path / "log"
    queued = await live_store.enqueue("default", "acme", {"input": {"log": str(log)}})
    async with running_worker(db_url, adapter.adapt(graphs.slow_graph), cancel_grace_s=120):
        async def sleeping() -> bool:
            return "slow-started" in lines(log)
        await until(sleeping, what="the slow node to start")
        await live_store.request_cancel(queued.run.id)
        run = await finished(live_store, queued.run.id, timeout_s=20)
    assert run.status == "cancelled"
    assert lines(log) == ["first", "slow-started"]


async def test_a_stop_ends_a_node_s_tool_process(live_store: RunStore, db_url: str,
                                                 tmp_path: Path) -> None:
    """A node runs a process through run_context().run_tool: the Stop ends
    the graph and the process (its group), and the run is cancelled."""
    log, pidfile = tmp_path / "log", tmp_path / "pid"
    queued = await live_store.enqueue("default", "acme", {"input": {"log": str(log)}})
    async with running_worker(db_url, adapter.adapt(graphs.process_graph), cancel_grace_s=120,
                              **HOST_FILES):
        async def started() -> bool:
            return pidfile.exists() and pidfile.read_text().strip() != ""
        await until(started, what="the tool process to start")
        pid = int(pidfile.read_text())
        await live_store.request_cancel(queued.run.id)
        run = await finished(live_store, queued.run.id, timeout_s=20)

        async def gone() -> bool:
            return not alive(pid)
        await until(gone, what="the tool process to end")
    assert run.status == "cancelled"
    assert lines(log) == ["first", "process-started"]


async def test_an_interrupt_parks_the_run_and_the_answer_resumes_it(
    db_url: str, workers: Any, tmp_path: Path
) -> None:
    """interrupt() parks the run (waiting: no lease); the worker that parked
    it is killed; the answer resumes the graph in another worker with
    Command(resume=answer), and the node before the interrupt never runs again."""
    log = tmp_path / "log"
    async with make_conn_pool(db_url, max_size=4) as pool:
        store = RunStore(pool)
        first = workers("w1", "approval")
        run = (await store.enqueue("default", "acme", {"input": {"log": str(log)}})).run

        async def parked() -> bool:
            return await status_is(store, run.id, "waiting")
        await until(parked, what="the run to wait for its approval", timeout_s=30)
        held = await store.get(run.id)
        assert held.locked_by is None
        first.kill9()
        async with store.connection() as c:
            row = await (await c.execute(
                "SELECT name, prompt, schema FROM agent_run_inputs WHERE run_id = %s",
                (run.id,))).fetchone()
        assert row is not None
        assert row["name"].startswith("interrupt-")
        assert (row["prompt"], row["schema"]) == ("Ship it?", {"type": "boolean"})
        workers("w2", "approval")
        assert await store.give_input(run.id, row["name"], True)
        done = await finished(store, run.id, timeout_s=60)
    assert done.status == "done", done.error_message
    assert lines(log) == ["first", "ask", "ask", "answered-True"]
    assert done.result_json is not None
    assert done.result_json["values"]["answer"] is True


async def test_an_interrupt_in_a_subgraph_parks_and_resumes(live_store: RunStore, db_url: str,
                                                            tmp_path: Path) -> None:
    log = tmp_path / "log"
    queued = await live_store.enqueue("default", "acme", {"input": {"log": str(log)}})
    async with running_worker(db_url, adapter.adapt(graphs.nested)):
        async def parked() -> bool:
            return await status_is(live_store, queued.run.id, "waiting")
        await until(parked, what="the run to wait for its approval")
        (asked,) = await live_store.input_requests(queued.run.id)
        assert await live_store.give_input(queued.run.id, asked.name, False)
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    assert lines(log) == ["first", "first", "ask", "ask", "answered-False"]
    assert run.result_json is not None
    assert run.result_json["values"]["answer"] is False
    async with live_store.connection() as c:
        spaces = await (await c.execute(
            "SELECT DISTINCT checkpoint_ns <> '' AS nested FROM agent_run_graph_checkpoints "
            "WHERE run_id = %s ORDER BY 1", (run.id,))).fetchall()
    assert [r["nested"] for r in spaces] == [False, True]


# -- the checkpoint store: fenced, tenant-scoped, bounded ------------------------------


async def put(store: RunStore, lease: Lease, checkpoint_id: str, data: bytes = b"x") -> None:
    await store.put_graph_checkpoint(
        lease, thread=str(lease.run_id), ns="", checkpoint_id=checkpoint_id, parent_id=None,
        type_="msgpack", data=data, metadata={"step": 1})


async def test_a_fenced_out_attempt_cannot_write_a_checkpoint(
    store: RunStore, clock: ManualClock
) -> None:
    await store.enqueue("default", "acme", {}, max_attempts=3)
    (old,) = await store.claim("default", "w1", 1)
    await put(store, old, "0001")
    await store.put_graph_writes(old, thread=str(old.run_id), ns="", checkpoint_id="0001",
                                 task_id="t1", task_path="", writes=[(0, "c", "msgpack", b"v")])
    # Its holder goes quiet: past its lease the write is refused before any reap...
    clock.advance(3600)
    with pytest.raises(LeaseLost):
        await put(store, old, "0002")
    # ...and after the run is reaped and claimed again, by another worker.
    await store.reap()
    (new,) = await store.claim("default", "w2", 1)
    assert (new.run_id, new.epoch) == (old.run_id, old.epoch + 1)
    for stale in (put(store, old, "0003"),
                  store.put_graph_writes(old, thread=str(old.run_id), ns="",
                                         checkpoint_id="0001", task_id="t2", task_path="",
                                         writes=[(0, "c", "msgpack", b"late")])):
        with pytest.raises(LeaseLost):
            await stale
    latest = await store.get_graph_checkpoint("acme", str(old.run_id), "")
    assert latest is not None
    assert latest.checkpoint_id == "0001"
    assert [w.task_id for w in await store.get_graph_writes(
        "acme", str(old.run_id), "", "0001")] == ["t1"]
    await put(store, new, "0004")
    latest = await store.get_graph_checkpoint("acme", str(old.run_id), "")
    assert latest is not None
    assert latest.checkpoint_id == "0004"


async def test_checkpoints_are_the_tenant_s_bounded_and_pruned(store: RunStore) -> None:
    await store.enqueue("default", "acme", {})
    (lease,) = await store.claim("default", "w1", 1)
    thread = str(lease.run_id)
    for i in range(20):
        await store.put_graph_checkpoint(
            lease, thread=thread, ns="", checkpoint_id=f"{i:04}", parent_id=None,
            type_="msgpack", data=b"x", metadata={"step": i}, keep=5)
    kept = await store.list_graph_checkpoints("acme", thread)
    assert [c.checkpoint_id for c in kept] == ["0019", "0018", "0017", "0016", "0015"]
    assert [c.checkpoint_id for c in await store.list_graph_checkpoints(
        "acme", thread, filter_={"step": 17})] == ["0017"]
    assert await store.list_graph_checkpoints("other", thread) == []
    with pytest.raises(ValidationError):
        await put(store, lease, "big", b"x" * (MAX_CHECKPOINT_BYTES + 1))
    with pytest.raises(ValidationError):
        await put(store, lease, "x" * 65)
    with pytest.raises(ValidationError):
        await store.list_graph_checkpoints("acme", thread, limit=10_001)
    assert len(await store.list_graph_checkpoints("acme", thread)) == 5


# -- the example ------------------------------------------------------------------------


async def test_the_example_agent_counts_asks_and_publishes(
    live_store: RunStore, db_url: str, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/langgraph_agent.py against the scripted model: a tool call,
    then `publish`, whose interrupt parks the run until it is approved."""
    from examples import langgraph_agent

    # OPENAI_BASE_URL: what `runlease dev --agent` sets for its scripted model.
    monkeypatch.delenv("RUNLEASE_OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    fake.script(
        Reply(tool_calls=[ToolCall("c1", "word_count", {"text": "ship it now"})]),
        Reply(tool_calls=[ToolCall("c2", "publish", {"title": "Word count", "body": "3"})]),
        Reply(content="Published the count: 3."),
    )
    queued = await live_store.enqueue("default", "acme", {"messages": [
        {"role": "user", "content": "count the words of 'ship it now' and publish it"}]})
    async with running_worker(db_url, adapter.adapt(langgraph_agent.graph)):
        async def parked() -> bool:
            return await status_is(live_store, queued.run.id, "waiting")
        await until(parked, what="the run to wait for the approval")
        (asked,) = await live_store.input_requests(queued.run.id)
        assert asked.prompt == "Publish 'Word count'?\n\n3"
        assert await live_store.give_input(queued.run.id, asked.name, True)
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    assert run.result_json is not None
    assert run.result_json["output"] == "Published the count: 3."
    tools = [m["content"] for m in run.result_json["messages"] if m["type"] == "tool"]
    assert tools == ["3", "published 'Word count'"]
    # The model was asked three times, not again after the wait.
    assert len(fake.requests) == 3
