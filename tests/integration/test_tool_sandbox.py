"""Tenants on one worker cannot touch each other's tools (worker/sandbox.py).

Real `runlease worker` processes, as root (tools then run as nobody) and as
a non-root uid (as in the image: tools run as the worker's own uid, in their
user namespace), against a real PostgreSQL. Each test plays the hostile
tenant: a tool that reads other processes' environments, signals whatever it
can find, looks for another run's files, forks without end, allocates
1 GiB, fills the disk, or leaves a daemon behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from psycopg.conninfo import conninfo_to_dict

from runlease.db.models import Run
from runlease.db.store import RunStore
from runlease.errors import SettingsError
from runlease.settings import WorkerSettings, load
from tests.support.proc import WorkerProcess, processes_with
from tests.support.waiting import until, until_sync
from tests.support.workers import running_worker

FAST = {"lease_s": 6, "heartbeat_interval_s": 1, "poll_interval_s": 0.2,
        "reaper_interval_s": 0.5, "leader_ttl_s": 2, "tool_kill_grace_s": 1}
NOBODY = 65534


def system_python() -> str:
    """An interpreter a non-root uid may run, of this one's version (the
    test's own may live under a directory only root can enter)."""
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = shutil.which(name, path="/usr/bin:/usr/local/bin:/bin")
    assert found, f"no {name} outside root's home for the non-root worker"
    return found


@pytest.fixture(params=["root", "non-root"])
def as_user(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(name: str, user: str = "root", *, unset: tuple[str, ...] = (),
              **settings: Any) -> WorkerProcess:
        # Not under tmp_path (0700): the tools' uid must reach their directories.
        runs = Path("/tmp") / f"runlease-test-runs-{os.getpid()}-{user}-{name}"
        process = WorkerProcess(db_url, tmp_path, name, FAST | {
            "agent": "runlease.agents.script:agent", "tool_runs_dir": str(runs)} | settings)
        process.env.update(SECRET_OF_THE_WORKER="worker-secret-0123456789")
        if user == "non-root":
            site = next(p for p in sys.path if p.endswith("site-packages"))
            process.env["PYTHONPATH"] += os.pathsep + site
            process.argv_prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                                   "--clear-groups"]
            process.python = system_python()
        for variable in unset:
            del process.env[variable]
        process.runs_dir = runs  # type: ignore[attr-defined]
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.cleanup()
        shutil.rmtree(process.runs_dir, ignore_errors=True)  # type: ignore[attr-defined]


async def finished(store: RunStore, run_id: UUID, timeout_s: float = 60) -> Run:
    async def probe() -> Run | None:
        run = await store.get(run_id)
        return run if run.status in ("done", "dead", "cancelled") else None

    return await until(probe, what=f"run {run_id} to finish", timeout_s=timeout_s)


async def stdout_of(store: RunStore, run_id: UUID, step: str = "0") -> str:
    return str((await store.get_steps(run_id))[step].result["stdout"])


def tool_pids(marker: str) -> list[int]:
    """Host pids of the tool's own processes (the shells), not of its wrappers."""
    return [pid for pid in processes_with(marker)
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sh\0")]


def kill_all(marker: str) -> None:
    for pid in processes_with(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_two_tenants_tools_cannot_read_signal_or_find_each_other(
    live_store: RunStore, workers: Any, as_user: str
) -> None:
    marker = f"acme-waits-{as_user}"
    # acme's tool keeps a file in its directory and waits for the test's word.
    acme_script = (f"echo acme-file-content > mine.txt; echo {marker} >/dev/null; "
                   "while [ ! -e go ]; do sleep 0.02; done; cat mine.txt")
    worker = workers("w", as_user, concurrency=2)
    assert worker.proc is not None
    acme = await live_store.enqueue("default", "acme", {"steps": [
        {"shell": ["sh", "-c", acme_script]}]}, max_attempts=1)
    try:
        acme_pids = await until(lambda: _some(tool_pids(marker)), what="acme's tool")
        assert worker.proc is not None
        acme_dir = worker.runs_dir / f"w{worker.proc.pid}" / f"{acme.run.id}-1"
        targets = " ".join(str(p) for p in [*acme_pids, worker.proc.pid])
        globex_script = (
            # Every environment it can read: its own processes' only.
            "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep RUNLEASE_RUN_ID; "
            "echo visible=$(ls -d /proc/[0-9]* | wc -l); "
            # acme's tool and the worker, by their host pids.
            f"for p in {targets}; do kill -9 $p 2>/dev/null; echo kill-$p=$?; done; "
            # acme's file, by its host path and by a search.
            f"cat {acme_dir}/mine.txt 2>/dev/null; echo read=$?; "
            "find / -xdev -name mine.txt 2>/dev/null; "
            "find /tmp /work /run /home /root /var/tmp -name mine.txt 2>/dev/null; "
            "echo end")
        globex = await live_store.enqueue("default", "globex", {"steps": [
            {"shell": ["sh", "-c", globex_script]}]}, max_attempts=1)
        globex_run = await finished(live_store, globex.run.id)
        assert globex_run.status == "done", globex_run.error_message
        out = await stdout_of(live_store, globex.run.id)
        # Only its own run's id in any environment it could read.
        ids = set(re.findall(r"RUNLEASE_RUN_ID=(\S+)", out))
        assert ids == {str(globex.run.id)}, out
        assert str(acme.run.id) not in out
        assert int(re.search(r"visible=(\d+)", out)[1]) <= 8, out  # type: ignore[index]
        for pid in targets.split():
            assert f"kill-{pid}=1" in out, out  # no such process, in its namespace
        assert "read=1" in out
        assert "mine.txt" not in out.replace("read=", "")
        assert "acme-file-content" not in out
        assert worker.proc.poll() is None  # the worker lives
        assert all(_alive(p) for p in acme_pids)  # and acme's tool
        (acme_dir / "go").touch()
        acme_run = await finished(live_store, acme.run.id)
        assert acme_run.status == "done", acme_run.error_message
        assert await stdout_of(live_store, acme.run.id) == "acme-file-content\n"
        # The run's directory goes with its attempt.
        until_sync(lambda: not acme_dir.exists(), what="acme's directory to go")
    finally:
        kill_all(marker)


async def test_a_fork_bomb_an_allocation_a_disk_fill_and_a_busy_loop_fail_only_their_run(
    live_store: RunStore, workers: Any, as_user: str
) -> None:
    workers("w", as_user, concurrency=8, tool_disk_mib=64, tool_file_size_mib=32,
            tool_cpu_s=1)
    bomb = "import os\nwhile True:\n    os.fork()\n"
    hostile = {
        "fork bomb": ["python3", "-c", bomb],
        "1 GiB": ["python3", "-c", "b = bytearray(1 << 30); print('allocated')"],
        "/tmp fill": ["sh", "-c", "set -e; for i in 1 2 3; do "
                                  "dd if=/dev/zero of=/tmp/fill$i bs=1M count=30; done"],
        "one big file": ["sh", "-c", "dd if=/dev/zero of=fill bs=1M count=1024"],
        "CPU": ["python3", "-c", "while True: pass"],
        # Files in a folder the worker may not list (write and search bits only).
        "hidden files": ["sh", "-c", "mkdir h && chmod 300 h && i=0; while [ $i -lt 100 ]; "
                                     "do i=$((i+1)); dd if=/dev/zero of=h/f$i bs=1M count=30 "
                                     "2>/dev/null; done; echo survived"],
        "many files": ["sh", "-c", "i=0; while [ $i -lt 100 ]; do i=$((i+1)); "
                                   "dd if=/dev/zero of=f$i bs=1M count=30 2>/dev/null; "
                                   "done; echo survived"],
    }
    runs = {}
    for name, argv in hostile.items():
        queued = await live_store.enqueue("default", "evil", {"steps": [{"shell": argv}]},
                                          max_attempts=1)
        runs[name] = queued.run.id
    bystander = await live_store.enqueue("default", "good", {"steps": [
        {"shell": ["sh", "-c", "i=0; while [ $i -lt 50 ]; do i=$((i+1)); "
                               "sh -c 'echo x > /tmp/x' ; done; echo fine"]}]})
    ended = {name: await finished(live_store, run_id) for name, run_id in runs.items()}
    for name, run in ended.items():
        assert run.status == "dead", (name, run.status)
    messages = {name: run.error_message or "" for name, run in ended.items()}
    assert "BlockingIOError" in messages["fork bomb"] or "fork" in messages["fork bomb"]
    assert "MemoryError" in messages["1 GiB"]
    assert "No space left on device" in messages["/tmp fill"]
    assert "exited 153" in messages["one big file"]  # SIGXFSZ: 128 + 25
    assert "went over its 64 MiB" in messages["many files"]
    assert "exited 152" in messages["CPU"]  # SIGXCPU: 128 + 24
    assert "went over its 64 MiB" in messages["hidden files"]
    good = await finished(live_store, bystander.run.id)
    assert good.status == "done", good.error_message
    assert await stdout_of(live_store, bystander.run.id) == "fine\n"


async def test_a_daemon_is_gone_when_its_step_ends(
    live_store: RunStore, workers: Any
) -> None:
    marker = "305.17"
    script = f"setsid sh -c 'trap \"\" TERM HUP; sleep {marker}' >/dev/null 2>&1 & echo started"
    workers("w")
    queued = await live_store.enqueue("default", "acme", {"steps": [
        {"shell": ["sh", "-c", script]}, {"shell": ["sh", "-c", "echo next"]}]})
    try:
        run = await finished(live_store, queued.run.id)
        assert run.status == "done", run.error_message
        # Gone before the step's result was committed: nothing to wait for.
        assert processes_with(f"sleep {marker}") == []
    finally:
        kill_all(f"sleep {marker}")


async def test_a_daemon_is_gone_when_the_worker_and_its_guard_are_killed(
    live_store: RunStore, workers: Any
) -> None:
    """kill -9 of the worker and of the tool's guard at once: the sandbox
    dies with its parent (bwrap --die-with-parent, then its PID 1)."""
    marker = "306.23"
    script = f"setsid sh -c 'trap \"\" TERM HUP; sleep {marker}' & sleep {marker}"
    worker = workers("w")
    assert worker.proc is not None
    await live_store.enqueue("default", "acme", {"steps": [{"shell": ["sh", "-c", script]}]})
    try:
        sleeps = await until(lambda: _some([p for p in processes_with(f"sleep {marker}")
                                            if _comm(p) == "sleep"], 2),
                             what="both sleeps to start")
        guards = [p for p in processes_with("toolguard.py") if f"sleep {marker}" in _cmd(p)]
        assert guards
        for pid in [worker.proc.pid, *guards]:
            os.kill(pid, signal.SIGKILL)
        until_sync(lambda: not [p for p in sleeps if _alive(p)], timeout_s=15,
                   what="the sandbox's processes to end with the worker and its guard")
    finally:
        kill_all(f"sleep {marker}")


async def test_a_killed_workers_run_directories_go_at_the_next_start(
    live_store: RunStore, workers: Any
) -> None:
    first = workers("w")
    assert first.proc is not None
    marker = "307.11"
    await live_store.enqueue("default", "acme", {"steps": [
        {"shell": ["sh", "-c", f"echo left > behind.txt; sleep {marker}"]}]})
    try:
        await until(lambda: _some(tool_pids(f"sleep {marker}")), what="the tool")
        left = first.runs_dir / f"w{first.proc.pid}"
        assert any(left.glob("*/behind.txt"))
        first.kill9()
        second = workers("w2", tool_runs_dir=str(first.runs_dir))
        assert second.proc is not None
        until_sync(lambda: not left.exists(), what="the dead worker's directories to go")
        assert second.proc.poll() is None
    finally:
        kill_all(f"sleep {marker}")


async def test_without_a_sandbox_one_tenants_tools_only(
    live_store: RunStore, db_url: str
) -> None:
    def settings(**given: Any) -> WorkerSettings:
        return load(WorkerSettings, {"agent": "runlease.agents.script:agent",
                                     "database_url": db_url, "tool_sandbox": False} | given,
                    environ={})

    with pytest.raises(SettingsError, match="--tool-tenant"):
        settings().check()
    with pytest.raises(SettingsError, match="--unsandboxed-pool"):
        settings(unsandboxed_pool="another-pool").check()  # the opt-in names this pool
    settings(unsandboxed_pool="default").check()
    settings(tool_tenant="acme").check()

    steps = {"steps": [{"shell": ["sh", "-c", "echo ran"]}]}
    mine = await live_store.enqueue("default", "acme", steps, max_attempts=1)
    other = await live_store.enqueue("default", "globex", steps, max_attempts=1)
    async with running_worker(db_url, tool_sandbox=False, tool_tenant="acme"):
        mine_run = await finished(live_store, mine.run.id)
        other_run = await finished(live_store, other.run.id)
    assert mine_run.status == "done", mine_run.error_message
    assert other_run.status == "dead"
    assert "another tenant" in (other_run.error_message or "")


async def _some(pids: list[int], n: int = 1) -> list[int] | None:
    return pids if len(pids) >= n else None


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_a_tool_cannot_read_the_workers_database_url_file(
    live_store: RunStore, db_url: str, workers: Any
) -> None:
    """Even world-readable, the file is /dev/null in the sandbox, on a nodev
    mount: it cannot be opened at all. (Not in
    /tmp, which the sandbox hides whole, nor under /work, its run directory.)"""
    holder = Path(tempfile.mkdtemp(prefix="runlease-url-test-", dir="/var/lib"))
    url_file = holder / "database-url"
    _world_readable(holder, url_file, db_url)
    try:
        workers("w", unset=("RUNLEASE_DATABASE_URL",), database_url_file=str(url_file))
        queued = await live_store.enqueue("default", "acme", {"steps": [
            {"shell": ["sh", "-c", f"cat {url_file} 2>&1; echo rc=$?"]}]})
        run = await finished(live_store, queued.run.id)
        assert run.status == "done", run.error_message
        out = await stdout_of(live_store, queued.run.id)
        assert db_url not in out
        assert "Permission denied" in out, out
    finally:
        shutil.rmtree(holder, ignore_errors=True)


@pytest.mark.parametrize("network", [False, True])
async def test_a_pool_without_network_keeps_its_tools_off_the_database_port(
    live_store: RunStore, db_url: str, workers: Any, network: bool
) -> None:
    """With the network (the default) the same probe connects: the check can fail."""
    port = conninfo_to_dict(db_url)["port"]
    probe = ["python3", "-c", "import socket, sys\n"
             "try:\n socket.create_connection(('127.0.0.1', int(sys.argv[1])), 5)\n"
             " print('connected')\nexcept OSError as exc:\n print('refused', exc.errno)",
             port]
    workers("w", tool_network=network)
    queued = await live_store.enqueue("default", "acme", {"steps": [{"shell": probe}]})
    run = await finished(live_store, queued.run.id)
    assert run.status == "done", run.error_message
    out = await stdout_of(live_store, queued.run.id)
    assert out.startswith("connected" if network else "refused"), out


def _world_readable(folder: Path, path: Path, text: str) -> None:
    folder.chmod(0o755)
    path.write_text(text)
    path.chmod(0o644)
