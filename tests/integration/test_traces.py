"""OpenTelemetry traces of a run, as a collector receives them: a real
`runlease api` process and real `runlease worker` processes export over
OTLP/HTTP to an in-process receiver (tests/support/otlp.py), and the tests
check the span tree of a run across the API, the worker and a tool, and that
a run reclaimed after kill -9 of its worker stays one trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from runlease import tracing
from tests.support.api import TOKENS
from tests.support.api_process import ApiProcess
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCall
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.proc import WorkerProcess
from tests.support.waiting import until, until_sync

pytestmark = pytest.mark.slow

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
FAST = {"lease_s": 4, "heartbeat_interval_s": 1, "poll_interval_s": 0.5,
        "reaper_interval_s": 0.5, "leader_ttl_s": 2}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture
def processes() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for p in started:
        p.cleanup()


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


def traced_api(db_url: str, tmp_path: Path, receiver: OtlpReceiver,
               processes: list[Any]) -> ApiProcess:
    api = ApiProcess(db_url, tmp_path)
    api.env.update(receiver.env())
    processes.append(api)
    return api.start()


def traced_worker(db_url: str, tmp_path: Path, receiver: OtlpReceiver, processes: list[Any],
                  name: str, extra_env: dict[str, str] | None = None,
                  **settings: Any) -> WorkerProcess:
    worker = WorkerProcess(db_url, tmp_path, name, FAST | settings)
    worker.env.update(receiver.env() | (extra_env or {}))
    processes.append(worker)
    return worker.start()


def submit(api: ApiProcess, body: dict[str, Any], traceparent: str | None) -> str:
    headers = {"Authorization": f"Bearer {TOKENS['acme']}"}
    if traceparent is not None:
        headers["traceparent"] = traceparent
    answer = httpx.post(f"{api.url}/v1/runs", json=body, headers=headers, timeout=10)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def stored_traceparent(db_url: str, run_id: str) -> str | None:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT traceparent FROM agent_runs WHERE id = %s",
                           (run_id,)).fetchone()
    assert row is not None
    return row[0]


def status(db_url: str, run_id: str) -> str:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT status FROM agent_runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return str(row[0])


def one(spans: list[ReceivedSpan]) -> ReceivedSpan:
    assert len(spans) == 1, spans
    return spans[0]


async def test_one_run_is_one_trace_across_api_worker_and_tool(
    db_url: str, tmp_path: Path, receiver: OtlpReceiver, processes: list[Any],
    fake: FakeOpenAI,
) -> None:
    fake.script(
        Reply(content="Looking.", tool_calls=[ToolCall(
            "call_1", "shell", {"argv": ["sh", "-c", "echo secret-arg; echo tp=$TRACEPARENT"]})],
            usage={"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}),
        Reply(content="Done.", usage={"prompt_tokens": 20, "completion_tokens": 3,
                                      "total_tokens": 23}),
    )
    api = traced_api(db_url, tmp_path, receiver, processes)
    worker = traced_worker(
        db_url, tmp_path, receiver, processes, "w", agent="runlease.agents.openai:agent",
        log_level="debug", log_json=True, extra_env={"RUNLEASE_OPENAI_BASE_URL": fake.base_url,
                                      "RUNLEASE_OPENAI_MODEL": "fake-model"})
    run_id = submit(api, {"input": {"messages": [{"role": "user", "content": "hi"}],
                                    "tools": ["shell"]}}, CALLER)
    await until(lambda: _async(status(db_url, run_id) == "done"), timeout_s=60,
                what="the run to finish")
    names = {"submit", "queue.wait", "attempt", "model.turn", "tool"}
    await until(lambda: _async(names <= {s.name for s in receiver.spans(trace_id=CALLER_TRACE)}
                               and len(receiver.spans(name="model.turn")) == 2),
                timeout_s=30, what="every span of the run exported")
    spans = receiver.spans(trace_id=CALLER_TRACE)
    assert {s.trace_id for s in receiver.spans()} == {CALLER_TRACE}, [
        s for s in receiver.spans() if s.trace_id != CALLER_TRACE]

    submit_span = one([s for s in spans if s.name == "submit"])
    assert (submit_span.service, submit_span.parent_span_id) == ("runlease-api", CALLER_SPAN)
    assert submit_span.attributes["runlease.run_id"] == run_id
    # The run keeps the submit span's context: the worker's spans are its children.
    assert stored_traceparent(db_url, run_id) == submit_span.traceparent

    wait = one([s for s in spans if s.name == "queue.wait"])
    attempt = one([s for s in spans if s.name == "attempt"])
    for span in (wait, attempt):
        assert span.service == "runlease-worker"
        assert span.parent_span_id == submit_span.span_id
        assert span.attributes["runlease.run_id"] == run_id
        assert span.attributes["runlease.attempt"] == 1
    assert wait.start_ns <= wait.end_ns <= attempt.start_ns + 50_000_000  # db vs worker clock
    assert attempt.attributes["runlease.lease_epoch"] == 1
    assert attempt.attributes["runlease.worker"].startswith("pod-w:")
    assert attempt.attributes["runlease.outcome"] == "done"
    assert attempt.status_code != 2

    turns = sorted((s for s in spans if s.name == "model.turn"),
                   key=lambda s: s.attributes["runlease.turn"])
    assert [t.parent_span_id for t in turns] == [attempt.span_id] * 2
    assert [(t.attributes["gen_ai.request.model"], t.attributes["gen_ai.usage.input_tokens"],
             t.attributes["gen_ai.usage.output_tokens"]) for t in turns] == [
        ("fake-model", 11, 7), ("fake-model", 20, 3)]

    tool = one([s for s in spans if s.name == "tool"])
    assert tool.parent_span_id == attempt.span_id
    assert tool.attributes["runlease.tool.command"] == "sh"
    assert tool.attributes["runlease.tool.exit_code"] == 0
    assert tool.attributes["runlease.tool.duration_s"] > 0
    assert turns[0].end_ns <= tool.start_ns <= tool.end_ns <= turns[1].start_ns
    # Never the tool's arguments or output.
    assert "secret-arg" not in json.dumps([s.attributes for s in spans])
    # The tool process was told its span: what it printed is in the second request.
    tool_message = next(m for m in fake.requests[1].body["messages"] if m["role"] == "tool")
    assert f"tp={tool.traceparent}" in tool_message["content"]

    # The worker's log lines inside a span name the trace and the span.
    lines = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    started = [line for line in lines if line["event"] == "tool_started"]
    assert len(started) == 1, worker.log()
    assert (started[0]["trace_id"], started[0]["span_id"]) == (CALLER_TRACE, tool.span_id)
    outside = [line for line in lines if line["event"] == "worker_started"]
    assert outside
    assert all("trace_id" not in line for line in outside)


async def _async(value: Any) -> Any:
    return value


def test_a_reclaimed_run_keeps_its_trace_after_kill_9(
    db_url: str, tmp_path: Path, receiver: OtlpReceiver, processes: list[Any],
) -> None:
    api = traced_api(db_url, tmp_path, receiver, processes)
    a = traced_worker(db_url, tmp_path, receiver, processes, "a",
                      agent="tests.support.agents:slow_first", reaper=False)
    run_id = submit(api, {"input": {}, "max_attempts": 3}, CALLER)
    until_sync(lambda: status(db_url, run_id) == "leased", timeout_s=30,
               what="worker a to claim the run")
    # Attempt 1's queue.wait is exported (it ended at the claim), the
    # attempt itself never ends: kill -9 mid-attempt.
    until_sync(lambda: receiver.spans(name="queue.wait", trace_id=CALLER_TRACE),
               timeout_s=30, what="attempt 1's queue.wait exported")
    a.kill9()
    traced_worker(db_url, tmp_path, receiver, processes, "b",
                  agent="tests.support.agents:slow_first", reaper=True)
    until_sync(lambda: status(db_url, run_id) == "done", timeout_s=60,
               what="worker b to reclaim and finish the run")
    attempt = until_sync(lambda: receiver.spans(name="attempt"), timeout_s=30,
                         what="attempt 2 exported")
    submit_span = one(receiver.spans(name="submit"))
    second = one(attempt)
    assert second.trace_id == CALLER_TRACE
    assert second.parent_span_id == submit_span.span_id
    assert (second.attributes["runlease.attempt"], second.attributes["runlease.lease_epoch"],
            second.attributes["runlease.outcome"]) == (2, 2, "done")
    assert second.attributes["runlease.worker"].startswith("pod-b:")
    waits = sorted(receiver.spans(name="queue.wait"), key=lambda s: s.attributes[
        "runlease.attempt"])
    assert [(w.trace_id, w.parent_span_id, w.attributes["runlease.attempt"]) for w in waits] == [
        (CALLER_TRACE, submit_span.span_id, 1), (CALLER_TRACE, submit_span.span_id, 2)]


def test_a_child_run_joins_its_parents_trace(
    db_url: str, tmp_path: Path, receiver: OtlpReceiver, processes: list[Any],
) -> None:
    api = traced_api(db_url, tmp_path, receiver, processes)
    traced_worker(db_url, tmp_path, receiver, processes, "w", concurrency=4,
                  agent="tests.support.agents:family")
    parent_id = submit(api, {"input": {"children": 2}}, None)  # a trace of its own
    until_sync(lambda: status(db_url, parent_id) == "done", timeout_s=60,
               what="the parent and its children to finish")
    submit_span = one(receiver.spans(name="submit"))
    trace = submit_span.trace_id

    def attempts() -> list[ReceivedSpan]:
        found = receiver.spans(name="attempt")
        return found if len(found) == 4 else []  # the parent's two (it waited), 2 children
    spans = until_sync(attempts, timeout_s=30, what="every attempt exported")
    assert {s.trace_id for s in spans} == {trace}
    parents = [s for s in spans if s.attributes["runlease.run_id"] == parent_id]
    children = [s for s in spans if s.attributes["runlease.run_id"] != parent_id]
    assert [p.attributes["runlease.outcome"] for p in sorted(
        parents, key=lambda s: s.start_ns)] == ["waiting", "done"]
    # Each child hangs under the parent's attempt that submitted it.
    first = min(parents, key=lambda s: s.start_ns)
    assert [c.parent_span_id for c in children] == [first.span_id] * 2
    stored = stored_traceparent(db_url, children[0].attributes["runlease.run_id"])
    assert stored is not None
    assert stored[:-3] == first.traceparent[:-3]  # the flags as the SDK set them


def test_a_pool_that_opts_in_sees_its_tools_arguments_redacted(
    db_url: str, tmp_path: Path, receiver: OtlpReceiver, processes: list[Any],
) -> None:
    api = traced_api(db_url, tmp_path, receiver, processes)
    traced_worker(db_url, tmp_path, receiver, processes, "w", trace_tool_arguments=True,
                  agent="runlease.agents.script:agent")
    script = "echo password=hunter2hunter2 >/dev/null; echo arg-" + "x" * 2000
    run_id = submit(api, {"input": {"steps": [{"shell": ["sh", "-c", script]}]}}, CALLER)
    until_sync(lambda: status(db_url, run_id) == "done", timeout_s=60, what="the run done")
    tool = until_sync(lambda: receiver.spans(name="tool"), timeout_s=30,
                      what="the tool's span exported")[0]
    shown = tool.attributes["runlease.tool.arguments"]
    assert shown.startswith('["sh", "-c", "echo password=')
    assert "hunter2" not in shown
    assert len(shown) == 1000  # bounded
    assert tool.attributes["runlease.tool.exit_code"] == 0


def test_a_refused_submit_is_a_failed_submit_span(
    db_url: str, tmp_path: Path, receiver: OtlpReceiver, processes: list[Any],
) -> None:
    api = traced_api(db_url, tmp_path, receiver, processes)
    headers = {"Authorization": f"Bearer {TOKENS['acme']}", "Idempotency-Key": "k-1",
               "traceparent": CALLER}
    answers = [httpx.post(f"{api.url}/v1/runs", json={"input": {"n": n}, **extra},
                          headers=headers, timeout=10)
               for n, extra in ((1, {}), (2, {}), (3, {"thread_id": "t"}))]
    assert [a.status_code for a in answers] == [201, 409, 409]
    spans = until_sync(lambda: (s := receiver.spans(name="submit")) and len(s) == 3 and s,
                       timeout_s=30, what="three submit spans")
    assert sorted(s.status_code for s in spans) == [0, 2, 2]  # the fast path and the route
    assert {s.parent_span_id for s in spans} == {CALLER_SPAN}


def test_a_message_taken_by_an_attempt_is_its_span(
    db_url: str, tmp_path: Path, receiver: OtlpReceiver, processes: list[Any],
) -> None:
    api = traced_api(db_url, tmp_path, receiver, processes)
    traced_worker(db_url, tmp_path, receiver, processes, "w",
                  agent="runlease.agents.script:agent")
    run_id = submit(api, {"input": {"steps": [{"receive": {"timeout_s": 60}}]}}, CALLER)
    until_sync(lambda: status(db_url, run_id) == "leased", timeout_s=30, what="the run claimed")
    answer = httpx.post(f"{api.url}/v1/runs/{run_id}/messages", timeout=10,
                        headers={"Authorization": f"Bearer {TOKENS['acme']}"},
                        json={"text": "private words"})
    assert answer.status_code == 202, answer.text
    until_sync(lambda: status(db_url, run_id) == "done", timeout_s=30, what="the run done")
    attempt = until_sync(lambda: receiver.spans(name="attempt"), timeout_s=30,
                         what="the attempt exported")[0]
    message = one(receiver.spans(name="message"))
    assert (message.trace_id, message.parent_span_id) == (CALLER_TRACE, attempt.span_id)
    assert message.attributes == {"runlease.message.seq": 1}
    # Sent while the attempt ran (by the database's clock), taken inside it.
    assert message.start_ns <= message.end_ns <= attempt.end_ns


def test_a_malformed_traceparent_is_ignored_never_refused(
    db_url: str, tmp_path: Path, receiver: OtlpReceiver, processes: list[Any],
) -> None:
    api = ApiProcess(db_url, tmp_path)  # not tracing: the header is stored as given
    processes.append(api.start())
    for bad in ("garbage", "00-" + "0" * 32 + "-" + CALLER_SPAN + "-01",
                "ff-" + CALLER_TRACE + "-" + CALLER_SPAN + "-01", CALLER + "x" * 10_000,
                "00-" + CALLER_TRACE.upper() + "-zz" + CALLER_SPAN[2:] + "-01", "-",
                "00-\u00e9" + CALLER_TRACE[1:] + "-" + CALLER_SPAN + "-01"):
        for fast in (True, False):
            body: dict[str, Any] = {"input": {"bad": bad[:20]}}
            if not fast:
                body["labels"] = {"path": "route"}
                body["thread_id"] = "t-" + str(len(bad))
            headers: dict[str, Any] = {"Authorization": f"Bearer {TOKENS['acme']}",
                       "traceparent": bad.encode("utf-8")}
            answer = httpx.post(f"{api.url}/v1/runs", json=body, headers=headers, timeout=10)
            assert answer.status_code == 201, (bad[:80], answer.text)
            assert stored_traceparent(db_url, answer.json()["id"]) is None
    # Upper case is normalised; a valid one is kept on both paths.
    for extra in ({}, {"thread_id": "kept"}):
        run_id = submit(api, {"input": {}, **extra}, CALLER.upper().replace("00-", "00-", 1))
        assert stored_traceparent(db_url, run_id) == CALLER
    assert receiver.spans() == []


@pytest.mark.parametrize(("value", "stored"), [
    (CALLER, CALLER),
    (CALLER.upper(), CALLER),
    ("01-" + CALLER[3:] + "-future-field", "00-" + CALLER[3:]),
    ("01-" + CALLER[3:] + "future-field", None),
    ("00-" + CALLER[3:] + "-x", None),
    ("00-" + CALLER_TRACE + "-" + "0" * 16 + "-01", None),
    ("", None),
    (None, None),
    ("x" * 100_000, None),
])
def test_parse_traceparent(value: str | None, stored: str | None) -> None:
    assert tracing.parse_traceparent(value) == stored


LOGGED_IN_A_SPAN = """
import logging
from runlease import logs, tracing
assert tracing.setup("runlease-test")
logs.configure("INFO")
with tracing.span("outer") as span:
    logging.getLogger("t").info("inside_span key=1")
    print(tracing.traceparent_of(span), flush=True)
logging.getLogger("t").info("outside_span key=2")
tracing.shutdown()
"""


def test_text_log_lines_in_a_span_end_with_its_ids() -> None:
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    done = subprocess.run([sys.executable, "-c", LOGGED_IN_A_SPAN], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    _, trace_id, span_id, _ = done.stdout.splitlines()[0].split("-")
    inside = next(line for line in done.stderr.splitlines() if "inside_span" in line)
    assert inside.endswith(f"inside_span key=1 trace_id={trace_id} span_id={span_id}")
    outside = next(line for line in done.stderr.splitlines() if "outside_span" in line)
    assert "trace_id" not in outside
    assert '"name": "outer"' in done.stdout  # the console exporter wrote the span


def test_tracing_is_off_unless_the_environment_asks() -> None:
    assert not tracing.wanted({})
    assert not tracing.wanted({"OTEL_SERVICE_NAME": "x"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "none",
                               "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not tracing.wanted({"OTEL_SDK_DISABLED": "true",
                               "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    # This test process never set tracing up: the helpers are no-ops.
    assert not tracing.ENABLED
    assert tracing.current_traceparent() is None
    assert tracing.log_ids() is None
    with tracing.span("x") as span:
        assert span is None
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in os.environ


async def test_a_wait_for_input_and_a_message_are_spans_of_the_runs_trace(
    db_url: str, tmp_path: Path, receiver: OtlpReceiver, processes: list[Any],
) -> None:
    """Issue 28's spans: `wait.input` (asked to answered, by the API that
    took the answer) and `message` (sent to taken, by the worker that took
    it), both in the run's trace."""
    api = traced_api(db_url, tmp_path, receiver, processes)
    traced_worker(db_url, tmp_path, receiver, processes, "w",
                  agent="runlease.agents.script:agent")
    run_id = submit(api, {"input": {"steps": [
        {"input": {"name": "approve", "schema": {"type": "boolean"}}},
        {"receive": {"timeout_s": 30}}]}}, CALLER)
    headers = {"Authorization": f"Bearer {TOKENS['acme']}"}
    await until(lambda: _async(status(db_url, run_id) == "waiting"), timeout_s=60,
                what="the run to wait")
    async with httpx.AsyncClient(base_url=api.url, headers=headers, timeout=10) as http:
        answered = await http.post(f"/v1/runs/{run_id}/input",
                                   json={"name": "approve", "value": True})
    assert answered.status_code == 200, answered.text
    await until(lambda: _async(status(db_url, run_id) == "leased"), timeout_s=60,
                what="the run to go on")
    async with httpx.AsyncClient(base_url=api.url, headers=headers, timeout=10) as http:
        sent = await http.post(f"/v1/runs/{run_id}/messages", json={"text": "go"})
    assert sent.status_code == 202, sent.text
    await until(lambda: _async(status(db_url, run_id) == "done"), timeout_s=60,
                what="the run to finish")
    def exported() -> bool:
        # The attempt holding the message ends (and is exported) after the
        # run is done: wait for it too, not only for the two spans.
        spans = receiver.spans(trace_id=CALLER_TRACE)
        messages = [s for s in spans if s.name == "message"]
        return ("wait.input" in {s.name for s in spans} and len(messages) == 1
                and messages[0].parent_span_id in {s.span_id for s in spans
                                                   if s.name == "attempt"})
    await until(lambda: _async(exported()), timeout_s=30,
                what="the wait and message spans and their attempt exported")
    spans = receiver.spans(trace_id=CALLER_TRACE)
    wait = one([s for s in spans if s.name == "wait.input"])
    assert wait.service == "runlease-api"
    assert wait.attributes["runlease.input.name"] == "approve"
    assert wait.start_ns <= wait.end_ns
    message = one([s for s in spans if s.name == "message"])
    assert message.service == "runlease-worker"
    attempts = [s for s in spans if s.name == "attempt"]
    assert message.parent_span_id in {a.span_id for a in attempts}
    assert message.attributes["runlease.message.seq"] == 1
