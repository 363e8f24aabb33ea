"""`runlease dev --agent examples.<lib>:agent` as a person tries it (issue 30):
the stack with the example agent and the scripted model (no key, offline),
a run submitted with the CLI, its approval answered with the CLI, done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from runlease.dev import MODEL_VARS
from tests.integration.test_dev_and_cli import ADMIN_TOKEN, TENANT_TOKEN, Dev, postgres_pids
from tests.support.proc import ROOT
from tests.support.waiting import until_sync

pytestmark = pytest.mark.slow


class AgentDev(Dev):
    def __init__(self, agent: str) -> None:
        super().__init__(workers=1)
        self.agent = agent

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in MODEL_VARS}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
        env.pop("DATABASE_URL", None)
        env.update(RUNLEASE_DEV_TOKENS=f"acme={TENANT_TOKEN}", RUNLEASE_ADMIN_TOKEN=ADMIN_TOKEN)
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runlease", "dev", "--data-dir", str(self.dir / "data"),
                 "--port", str(self.port), "--workers", "1", "--agent", self.agent],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        until_sync(self.ready, timeout_s=60, what="runlease dev to serve")


@contextmanager
def agent_dev(agent: str) -> Iterator[AgentDev]:
    d = AgentDev(agent)
    try:
        d.start()
        yield d
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.send_signal(signal.SIGINT)
            try:
                d.proc.wait(60)
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait(10)
        for pid in postgres_pids(d.dir):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(params=["examples.openai_agents_agent:agent", "examples.pydantic_ai_agent:agent"])
def stack(request: pytest.FixtureRequest) -> Iterator[AgentDev]:
    with agent_dev(request.param) as d:
        yield d


def test_an_example_agent_runs_against_the_scripted_model(stack: AgentDev) -> None:
    banner = stack.log.read_text()
    assert f"agent {stack.agent}" in banner
    assert "model      scripted, at http://127.0.0.1:" in banner
    run = stack.json("runs", "submit", "--input", '{"input": "Plan a day in Oslo"}')["id"]

    def status() -> str:
        return str(stack.json("runs", "show", run)["status"])
    until_sync(lambda: status() == "waiting", timeout_s=60,
               what=f"the run to wait for its approval ({stack.log.read_text()[-2000:]})")
    asked = stack.json("runs", "input", run)
    (request,) = asked if isinstance(asked, list) else asked["items"]
    name = request["name"]
    assert name.startswith("approve-")
    assert "book_table" in request["prompt"]
    answered = stack.cli("runs", "input", run, "--name", name, "--value", "true")
    assert answered.returncode == 0, answered.stderr
    until_sync(lambda: status() == "done", timeout_s=60, what="the run to finish")
    shown = stack.json("runs", "show", run)
    result = str(shown["result"])
    assert "weather returned: Sunny and 21 C" in result
    assert "book_table returned: Booked a table" in result
    tail = stack.cli("runs", "tail", run)
    assert tail.returncode == 0, tail.stderr
    assert "weather" in tail.stdout
    assert "book_table" in tail.stdout


@pytest.fixture
def graph_stack() -> Iterator[AgentDev]:
    with agent_dev("examples.langgraph_agent:graph") as d:
        yield d


def test_the_langgraph_example_runs_against_the_scripted_model(graph_stack: AgentDev) -> None:
    """The LangGraph example through `runlease dev --agent`: checkpointed in
    the dev stack's PostgreSQL, its `publish` tool's interrupt() answered
    with the CLI."""
    stack = graph_stack
    run = stack.json("runs", "submit", "--input", '{"messages": [{"role": "user", '
                     '"content": "Count the words of \'ship it now\' and publish it"}]}')["id"]

    def status() -> str:
        return str(stack.json("runs", "show", run)["status"])
    until_sync(lambda: status() == "waiting", timeout_s=90,
               what=f"the run to wait for its approval ({stack.log.read_text()[-2000:]})")
    asked = stack.json("runs", "input", run)
    (request,) = asked if isinstance(asked, list) else asked["items"]
    assert "Publish" in request["prompt"]
    answered = stack.cli("runs", "input", run, "--name", request["name"], "--value", "true")
    assert answered.returncode == 0, answered.stderr
    until_sync(lambda: status() == "done", timeout_s=90,
               what=f"the run to finish ({stack.log.read_text()[-2000:]})")
    result = str(stack.json("runs", "show", run)["result"])
    assert "published" in result
