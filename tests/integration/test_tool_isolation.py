"""Tools are hostile: a tool sees none of its worker's secrets, and no tool
process outlives the worker that started it, even one killed with SIGKILL.
Real `runlease worker` processes where the claim is about a process; a real
PostgreSQL throughout."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from runlease.db.models import Run
from runlease.db.store import RunStore
from runlease.worker import toolenv
from runlease.worker.tools import ToolRunner
from tests.support.proc import ROOT, WorkerProcess, processes_with
from tests.support.waiting import until, until_sync
from tests.support.workers import running_worker

FAST = {"lease_s": 6, "heartbeat_interval_s": 1, "poll_interval_s": 0.2,
        "reaper_interval_s": 0.5, "leader_ttl_s": 2, "tool_kill_grace_s": 1}
# Planted in the worker's environment. Plain values: the store's redaction
# must not be what keeps them out of a stored result.
PLANTED = {
    "OPENAI_API_KEY": "modelkey0123456789abcdef",
    "PLANTED_SECRET": "plantedvalue4711",
    "PLANTED_VALUE": "unrelatedvalue0815",  # a name that looks like nothing
}
RUN_VARS = {"RUNLEASE_RUN_ID", "RUNLEASE_ATTEMPT", "RUNLEASE_LEASE_EPOCH"}
# PWD: bwrap sets it, after --chdir into the run's directory (worker/sandbox.py).
ALLOWED = {"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PWD"}


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(name: str, prefix: tuple[str, ...] = (), **settings: Any) -> WorkerProcess:
        process = WorkerProcess(db_url, tmp_path, name, FAST | settings)
        process.env.update(PLANTED, DATABASE_URL=db_url, LANG="C.UTF-8", TZ="UTC")
        process.argv_prefix = list(prefix)
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.cleanup()


async def finished(store: RunStore, run_id: UUID) -> Run:
    async def probe() -> Run | None:
        run = await store.get(run_id)
        return run if run.status in ("done", "dead", "cancelled") else None

    return await until(probe, what=f"run {run_id} to finish")


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def assert_no_worker_secret(env: dict[str, str], db_url: str) -> None:
    text = "\n".join(f"{k}={v}" for k, v in env.items())
    for name, value in PLANTED.items():
        assert name not in env
        assert value not in text
    assert db_url not in text
    assert not {"DATABASE_URL", "RUNLEASE_DATABASE_URL", "RUNLEASE_AGENT", "SMUGGLED"} & set(env)
    assert {k for k in env if k.startswith("RUNLEASE_")} <= RUN_VARS | {"RUNLEASE_STEP"}


async def test_a_tool_sees_none_of_the_workers_secrets(
    live_store: RunStore, db_url: str, workers: Any
) -> None:
    show = 'echo "[$RUNLEASE_DATABASE_URL|$DATABASE_URL|$OPENAI_API_KEY|$PLANTED_SECRET|' \
           '$PLANTED_VALUE]"'
    queued = await live_store.enqueue("default", "acme", {"steps": [
        {"shell": ["env"]}, {"shell": ["sh", "-c", show]}]})
    workers("a", agent="runlease.agents.script:agent")
    run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    steps = await live_store.get_steps(run.id)
    env = parse_env(steps["0"].result["stdout"])
    assert_no_worker_secret(env, db_url)
    # What a tool does get: the allowlist and the run's own variables.
    assert set(env) <= ALLOWED | RUN_VARS | {"RUNLEASE_STEP"} | {
        k for k in env if k.startswith("LC_")}
    assert (env["PATH"], env["LANG"], env["TZ"]) == (os.environ["PATH"], "C.UTF-8", "UTC")
    assert (env["RUNLEASE_RUN_ID"], env["RUNLEASE_STEP"], env["RUNLEASE_ATTEMPT"]) == (
        str(run.id), "0", "1")
    assert steps["1"].result["stdout"] == "[||||]\n"


async def test_agent_code_cannot_hand_the_workers_environment_to_a_tool(
    live_store: RunStore, db_url: str, workers: Any
) -> None:
    # The agent passes env=dict(os.environ), and a copy made before the worker
    # took its secrets out of os.environ, and a variable carrying the URL.
    queued = await live_store.enqueue("default", "acme", {})
    worker = workers("a", agent="tests.support.agents:environ_tool")
    run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    env = parse_env(run.result_json["env"])
    assert_no_worker_secret(env, db_url)
    assert env["AGENT_SET"] == "set-by-the-agent"  # what the agent itself set does pass
    assert env["RUNLEASE_RUN_ID"] == str(run.id)
    assert "tool_env_refused names=SMUGGLED" in worker.log()


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)")
async def test_a_tool_cannot_reach_into_its_worker_or_its_guard(
    live_store: RunStore, workers: Any
) -> None:
    # /proc/<pid>/environ keeps what a process was started with, whatever it
    # removed since. A tool of the worker's user reads it unless the worker is
    # non-dumpable. As in a worker pod, the worker (and so its tools) runs
    # with no capability: here as root, whose capabilities would allow it.
    # Unsandboxed (root without capabilities cannot make a user namespace):
    # what is tested here is the worker's and the guard's own protection.
    no_caps = ("setpriv", "--bounding-set=-all", "--inh-caps=-all")
    worker = workers("a", prefix=no_caps, agent="runlease.agents.script:agent",
                     tool_sandbox=False, unsandboxed_pool="default")
    assert worker.proc is not None
    read = ["sh", "-c", f"tr '\\0' '\\n' < /proc/{worker.proc.pid}/environ; echo status=$?"]
    # Nor its guard's open files: a write end opened on the guard's lifeline
    # would keep it from seeing the worker die; a forged status, fool the worker.
    guard = ["sh", "-c", 'for f in /proc/$PPID/fd/*; do true <> "$f" && echo "opened $f"; done '
                         "2> /dev/null; echo end"]
    queued = await live_store.enqueue("default", "acme", {"steps": [
        {"shell": read}, {"shell": guard}]})
    run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    steps = await live_store.get_steps(run.id)
    stdout = steps["0"].result["stdout"]
    assert "DATABASE_URL" not in stdout
    assert re.fullmatch(r"status=[1-9]\n", stdout), stdout  # Permission denied
    assert steps["1"].result["stdout"] == "end\n"


async def test_a_pool_grant_passes_a_variable_but_never_the_database_url(
    live_store: RunStore, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRANTED_VAR", "granted-value")
    monkeypatch.setenv("PLANTED_VALUE", PLANTED["PLANTED_VALUE"])
    monkeypatch.setenv("RUNLEASE_DATABASE_URL", db_url)
    queued = await live_store.enqueue("default", "acme", {"steps": [{"shell": ["env"]}]})
    async with running_worker(db_url, tool_grant=frozenset({"GRANTED_VAR",
                                                            "RUNLEASE_DATABASE_URL"})):
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    env = parse_env((await live_store.get_steps(run.id))["0"].result["stdout"])
    assert env["GRANTED_VAR"] == "granted-value"
    assert "PLANTED_VALUE" not in env
    assert "RUNLEASE_DATABASE_URL" not in env  # granted, and still refused


async def test_the_pools_tool_env_is_what_a_worker_grants(
    live_store: RunStore, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grant comes from the pool row the worker reads at start, not from
    the worker's own options."""
    from runlease.db.models import Pool

    monkeypatch.setenv("GRANTED_VAR", "granted-value")
    monkeypatch.setenv("NOT_GRANTED", "stays-home")
    await live_store.upsert_pool(Pool("default", tool_env=("GRANTED_VAR",)))
    queued = await live_store.enqueue("default", "acme", {"steps": [{"shell": ["env"]}]})
    async with running_worker(db_url):
        run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    env = parse_env((await live_store.get_steps(run.id))["0"].result["stdout"])
    assert env["GRANTED_VAR"] == "granted-value"
    assert "NOT_GRANTED" not in env


def test_the_seal_keeps_the_key_for_the_agent_and_out_of_children() -> None:
    # A fresh interpreter: sealing changes the process's own environment.
    code = """
import ctypes, os, subprocess
from runlease.worker import toolenv
from runlease.agents.openai import _settings
toolenv.seal(["postgresql://u:fromoption@h/db"])
child = subprocess.run(["env"], capture_output=True, text=True).stdout
print("child:", sorted(line.split("=")[0] for line in child.splitlines()))
print("key:", _settings().openai_api_key)
print("dumpable:", ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))
print("refused:", sorted(toolenv.build({"X": "see postgresql://u:fromoption@h/db"})))
"""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT / "src"), "LANG": "C.UTF-8",
           "RUNLEASE_OPENAI_API_KEY": "modelkey0123456789abcdef",
           "RUNLEASE_DATABASE_URL": "postgresql://u:p@h/db", "GITHUB_TOKEN": "ghp_123456789",
           "PGPASSWORD": "libpqpassword", "UNRELATED": "stays"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    # libpq reads PGPASSWORD at every reconnect of the worker's pool: it stays.
    assert out[0] == "child: ['LANG', 'PATH', 'PGPASSWORD', 'PYTHONPATH', 'UNRELATED']"
    assert out[1] == "key: modelkey0123456789abcdef"  # read from the start environment
    assert out[2] == "dumpable: 0"
    assert out[3] == "refused: ['LANG', 'PATH']"  # X carried a secret given as an option


async def test_no_tool_outlives_a_killed_worker(
    live_store: RunStore, db_url: str, workers: Any
) -> None:
    marker = "301.27"
    # A background sleep, one that leaves the group (setsid), and the shell's own.
    script = f"sleep {marker} & setsid sleep {marker} & sleep {marker}"
    await live_store.enqueue("default", "acme", {"steps": [
        {"shell": ["sh", "-c", script]}]})
    worker = workers("a", agent="runlease.agents.script:agent")
    # The shell and three sleeps (and now the guard: its command line names the tool's).
    pids = await until(lambda: _at_least(4, f"sleep {marker}"), what="the tool to start")
    worker.kill9()
    until_sync(lambda: not [p for p in pids if _alive(p)], timeout_s=15,
               what="every process of the tool to end after the worker's kill -9")
    assert processes_with(f"sleep {marker}") == []


async def test_a_cancel_stops_what_left_the_tools_group_too(
    live_store: RunStore, db_url: str
) -> None:
    marker = "303.17"
    # Two processes that leave the group (setsid): one obeys SIGTERM, one ignores it.
    script = (f"setsid sleep {marker} & setsid sh -c 'trap \"\" TERM; sleep {marker}' & "
              f"sleep {marker}")
    queued = await live_store.enqueue("default", "acme", {"steps": [
        {"shell": ["sh", "-c", script]}]})
    try:
        async with running_worker(db_url, tool_kill_grace_s=1):
            await until(lambda: _at_least(5, f"sleep {marker}"), what="the tool to start")
            await live_store.request_cancel(queued.run.id)
            run = await finished(live_store, queued.run.id)
            # The run was finalized after its tool was stopped.
            assert processes_with(f"sleep {marker}") == []
    finally:
        for pid in processes_with(f"sleep {marker}"):
            os.kill(pid, signal.SIGKILL)
    assert run.status == "cancelled"


async def test_a_tool_call_leaves_nothing_running(
    live_store: RunStore, db_url: str
) -> None:
    marker = "302.31"
    queued = await live_store.enqueue("default", "acme", {"steps": [
        {"shell": ["sh", "-c", f"sleep {marker} >/dev/null 2>&1 & echo started"]}]})
    try:
        async with running_worker(db_url):
            run = await finished(live_store, queued.run.id)
            assert run.status == "done", run.error_message
            # The step's result was committed after the tool call returned.
            assert processes_with(f"sleep {marker}") == []
    finally:
        for pid in processes_with(f"sleep {marker}"):
            os.kill(pid, signal.SIGKILL)
    assert (await live_store.get_steps(run.id))["0"].result["stdout"] == "started\n"


async def test_the_guard_reports_what_the_tool_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = ToolRunner(asyncio.Event(), 1.0)
    with pytest.raises(FileNotFoundError):
        await runner.run(["/no/such/tool"])
    with pytest.raises(PermissionError):
        await runner.run([str(tmp_path)])
    result = await runner.run(["sh", "-c", "pwd; echo err >&2; exit 3"], cwd=str(tmp_path))
    assert (result.returncode, result.stdout, result.stderr) == (3, f"{tmp_path}\n", "err\n")
    killed = await runner.run(["sh", "-c", "kill -9 $$"])
    assert killed.returncode == -signal.SIGKILL
    # The tool gets the environment built for it, and nothing the guard's own
    # interpreter added (Python sets LC_CTYPE when it coerces a C locale).
    monkeypatch.delenv("LC_CTYPE", raising=False)
    monkeypatch.setenv("LANG", "C")
    assert parse_env((await runner.run(["env"])).stdout) == toolenv.build(None)
    assert not runner.live


async def _at_least(n: int, marker: str) -> list[int] | None:
    found = processes_with(marker)
    return found if len(found) >= n else None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
