"""`runlease dev` as a user starts it, driven by the `runlease` CLI, then
stopped with SIGINT: a run served end to end, and no process left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runlease.db.embedded import free_port
from tests.support.proc import ROOT
from tests.support.waiting import until_sync

pytestmark = pytest.mark.slow

TENANT_TOKEN = "acme-token-for-dev-0123"
ADMIN_TOKEN = "admin-token-for-dev-0123"


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def postgres_pids(data_dir: Path) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(data_dir) in cmdline and "postgres" in cmdline:
                pids.add(int(entry.name))
    return pids


class Dev:
    def __init__(self, workers: int = 1, *args: str) -> None:
        self.workers = workers
        self.args = args  # more options of `runlease dev`
        self.dir = Path(tempfile.mkdtemp(prefix="runlease-dev-test-"))
        self.dir.chmod(0o755)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.dir / "dev.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        env.pop("DATABASE_URL", None)  # the embedded default, as on a fresh machine
        # Tokens through the environment: never on a command line (docs/security.md).
        env.update(RUNLEASE_DEV_TOKENS=f"acme={TENANT_TOKEN}", RUNLEASE_ADMIN_TOKEN=ADMIN_TOKEN)
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runlease", "dev", "--data-dir", str(self.dir / "data"),
                 "--port", str(self.port), "--workers", str(self.workers), *self.args],
                env=env, stdout=log, stderr=subprocess.STDOUT)
        until_sync(self.ready, timeout_s=60, what="runlease dev to serve")

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def cli(self, *args: str, token: str = TENANT_TOKEN) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "RUNLEASE_API_URL": self.url, "RUNLEASE_TOKEN": token,
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        return subprocess.run([sys.executable, "-m", "runlease", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)

    def json(self, *args: str, token: str = TENANT_TOKEN) -> Any:
        result = self.cli(*args, "--json", token=token)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture
def dev() -> Iterator[Dev]:
    d = Dev()
    d.start()
    try:
        yield d
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(10)
        for pid in postgres_pids(d.dir):
            os.kill(pid, signal.SIGKILL)


def test_dev_serves_runs_through_the_cli_and_leaves_nothing_behind(dev: Dev) -> None:
    assert "token      acme: " + TENANT_TOKEN in dev.log.read_text()
    # The shell also prints a terminal escape (clear screen): tail must not pass it on.
    plan = json.dumps({"steps": [{"emit": {"text": "hi"}},
                                 {"shell": ["printf", "ok\n\x1b[2J\n"]}]})
    run = dev.json("runs", "submit", "--input", plan, "--idempotency-key", "k1")
    tail = dev.cli("runs", "tail", run["id"])
    assert tail.returncode == 0, tail.stderr
    assert "message" in tail.stdout
    assert "end: done" in tail.stdout
    assert "\nok\n" in tail.stdout  # the shell step's output, as it printed it
    assert "\x1b" not in tail.stdout
    steps = dev.json("runs", "steps", run["id"])
    assert [(s["key"], s["result"].get("stdout")) for s in steps["items"]] == [
        ("0", None), ("1", "ok\n\x1b[2J\n")]
    assert "ok" in dev.cli("runs", "steps", run["id"]).stdout
    finished = dev.cli("runs", "cancel", run["id"])  # a 409 that names the status
    assert finished.returncode == 1
    assert "409 invalid_transition" in finished.stderr
    assert "in status done" in finished.stderr
    shown = dev.json("runs", "show", run["id"])
    assert (shown["status"], shown["result"]) == ("done", {"steps": 2})
    assert dev.json("runs", "submit", "--input", plan, "--idempotency-key", "k1")["id"] == \
        run["id"]
    listed = dev.json("runs", "list")
    assert [r["id"] for r in listed["items"]] == [run["id"]]
    assert dev.json("runs", "list", "-o", "json") == listed
    table = dev.cli("runs", "list")  # a pipe: 80 columns, and still whole ids
    assert run["id"] in table.stdout, table.stdout
    assert run["id"] in dev.cli("runs", "list", "--wide").stdout

    long = dev.json("runs", "submit", "--input",
                    json.dumps({"steps": [{"shell": ["sleep", "300"]}]}))
    until_sync(lambda: dev.json("runs", "show", long["id"])["status"] == "leased",
               what="the long run to start")
    assert dev.json("runs", "cancel", long["id"])["status"] == "leased"
    until_sync(lambda: dev.json("runs", "show", long["id"])["status"] == "cancelled",
               what="the cancel")

    dead = dev.json("runs", "submit", "--input", json.dumps({"steps": [{"fail": "fatal"}]}))
    until_sync(lambda: dev.json("runs", "show", dead["id"])["status"] == "dead")
    # As a user in a shell (issue 31): a pipe greps whole rows, tail exits by how
    # the run ended, the start of an id names it, a bare bulk cancel is refused.
    piped = dev.cli("runs", "list").stdout.splitlines()
    assert [line.split()[:2] for line in piped if " dead " in line] == [[dead["id"], "dead"]]
    assert all(len(line) <= 80 for line in piped), piped
    assert dev.cli("runs", "tail", dead["id"]).returncode == 3
    assert dev.json("runs", "show", dead["id"][:23])["id"] == dead["id"]
    bare = dev.cli("runs", "cancel")
    assert bare.returncode == 2
    assert "--all" in bare.stderr
    assert dev.cli("runs", "list", "-o", "name").stdout.split()[0] == dead["id"]
    letters = dev.json("dead", "list", token=ADMIN_TOKEN)
    assert [r["id"] for r in letters["items"]] == [dead["id"]]
    assert dev.cli("dead", "list").returncode == 1  # a tenant is not admin
    assert dev.json("dead", "redrive", dead["id"], token=ADMIN_TOKEN)[0]["status"] == "pending"
    pool = dev.json("pools", "upsert", "batch", "--limit", "acme=2", token=ADMIN_TOKEN)
    assert pool["tenant_limits"] == {"acme": 2}
    assert {p["name"] for p in dev.json("pools", "list", token=ADMIN_TOKEN)} == {"default",
                                                                                  "batch"}
    bad = dev.cli("runs", "submit", "--input", json.dumps({"x": 1}), "--priority", "500")
    assert bad.returncode == 1
    assert "priority" in bad.stderr

    assert dev.proc is not None
    children = descendants(dev.proc.pid)
    servers = postgres_pids(dev.dir)
    assert children
    assert servers
    started = time.monotonic()
    dev.proc.send_signal(signal.SIGINT)
    assert dev.proc.wait(60) == 0, dev.log.read_text()[-3000:]
    print(f"runlease dev stopped {time.monotonic() - started:.1f} s after SIGINT")
    until_sync(lambda: not any(alive(p) for p in children | servers), timeout_s=10,
               what="every process of runlease dev to exit")
    assert not postgres_pids(dev.dir)


def test_a_second_dev_in_the_same_folder_is_refused_and_stops_nothing(dev: Dev) -> None:
    """It used to reuse the first stack's PostgreSQL and stop it on exit,
    leaving the first answering 503."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("DATABASE_URL", None)
    data = str(dev.dir / "data")
    second = subprocess.run(
        [sys.executable, "-m", "runlease", "dev", "--data-dir", data, "--port",
         str(free_port()), "--workers", "0"],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert second.returncode == 1, second
    assert "Traceback" not in second.stderr
    assert f"is in use by runlease dev (pid {dev.proc.pid if dev.proc else 0}, API {dev.url})" \
        in second.stderr
    assert "--data-dir" in second.stderr
    # `migrate` in the folder uses the running server and leaves it running.
    migrated = subprocess.run([sys.executable, "-m", "runlease", "migrate", "--data-dir", data],
                              env=env, capture_output=True, text=True, timeout=60, check=False)
    assert migrated.returncode == 0, migrated.stderr
    assert dev.ready()
    run = dev.json("runs", "submit", "--input", json.dumps({"steps": []}))
    until_sync(lambda: dev.json("runs", "show", run["id"])["status"] == "done",
               what="a run served after the refused second stack")


README_AGENT = """\
async def agent(ctx):
    return {"by": "my own agent", "input": ctx.input}
"""


def test_the_readme_own_agent_path() -> None:
    """README: `runlease dev --workers 0`, then `runlease worker --agent
    mymodule:agent --pool default --database-url <the banner's database>`
    in mymodule.py's folder. Every run goes to that agent (with the dev
    stack's own script-agent workers on `default`, 7 of 8 went to them)."""
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin/runlease dev --workers 0" in readme
    assert "runlease worker --agent mymodule:agent --pool default" in readme
    assert "--database-url-file" in readme
    stack = Dev(workers=0)
    stack.start()
    folder = stack.dir / "mine"
    folder.mkdir()
    (folder / "mymodule.py").write_text(README_AGENT)
    database = re.search(r"^your agent +runlease worker --database-url-file (\S+) ",
                         stack.log.read_text(), re.M)
    assert database, stack.log.read_text()
    assert (Path(database.group(1)).stat().st_mode & 0o777) == 0o600
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RUNLEASE_") and k != "DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    worker = subprocess.Popen(
        [sys.executable, "-P", "-m", "runlease", "worker", "--agent", "mymodule:agent",
         "--pool", "default", "--database-url-file", database.group(1), "--metrics-port", "0"],
        cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        runs = [stack.json("runs", "submit", "--input", json.dumps({"n": i}))["id"]
                for i in range(8)]
        for run_id in runs:
            until_sync(lambda r=run_id: stack.json("runs", "show", r)["status"] == "done",
                       what="a run done by the README's own agent")
        results = [stack.json("runs", "show", r)["result"] for r in runs]
        assert results == [{"by": "my own agent", "input": {"n": i}} for i in range(8)]
    finally:
        worker.terminate()
        worker.wait(30)
        assert stack.proc is not None
        stack.proc.send_signal(signal.SIGINT)
        stack.proc.wait(60)
        for pid in postgres_pids(stack.dir):
            os.kill(pid, signal.SIGKILL)


def test_dev_refuses_tokens_on_its_command_line() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    for args in (["--token", f"acme={TENANT_TOKEN}"], ["--admin-token", ADMIN_TOKEN]):
        done = subprocess.run([sys.executable, "-m", "runlease", "dev", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2, done.stderr
        assert "readable by every process" in done.stderr


# What a hostile tool of the dev stack tries: every token and password it can
# find (environments, command lines, the data directory), then a login to the
# database's port without a password (the PostgreSQL startup message, by hand:
# the tool has no driver). It prints the server's answer: R + 0 would be
# "authentication ok" (trust), R + 10 is SASL (scram): a password is wanted.
PROBE = r"""
import glob, os, socket, struct, sys
for path in glob.glob("/proc/[0-9]*/cmdline") + glob.glob("/proc/[0-9]*/environ"):
    try:
        print(path, open(path, "rb").read().replace(b"\0", b" ").decode(errors="replace"))
    except OSError as exc:
        print(path, "unreadable", exc.errno)
data = sys.argv[1]
for root, dirs, files in os.walk(data):
    for name in files:
        try:
            print("file", name, open(os.path.join(root, name), errors="replace").read(200))
        except OSError as exc:
            print("file", name, "unreadable", exc.errno)
print("listed", os.listdir(data) if os.path.isdir(data) else "no such dir")
body = b"user\0postgres\0database\0postgres\0\0"
s = socket.create_connection(("127.0.0.1", int(sys.argv[2])), 5)
s.sendall(struct.pack("!ii", 8 + len(body), 196608) + body)
kind, length = struct.unpack("!ci", s.recv(5))
code = struct.unpack("!i", s.recv(4))[0] if kind == b"R" else None
print("answer", kind.decode(), code)
"""


def test_a_dev_stack_tool_finds_no_token_and_cannot_log_in(dev: Dev) -> None:
    log = dev.log.read_text()
    port = int(log.split("database   postgresql://postgres:***@127.0.0.1:")[1].split("/")[0])
    password = (dev.dir / "data" / "superuser.password").read_text().strip()
    assert password not in log  # the banner shows the URL without it
    assert "WARNING" not in log  # this machine sandboxes tools
    assert dev.proc is not None
    for pid in {dev.proc.pid, *descendants(dev.proc.pid)}:  # what the host sees
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert TENANT_TOKEN not in cmdline
        assert ADMIN_TOKEN not in cmdline
        assert password not in cmdline
    plan = json.dumps({"steps": [{"shell": [
        "python3", "-c", PROBE, str(dev.dir / "data"), str(port)]}]})
    run = dev.json("runs", "submit", "--input", plan)
    until_sync(lambda: dev.json("runs", "show", run["id"])["status"] in ("done", "dead"),
               timeout_s=60, what="the probing run to finish")
    shown = dev.json("runs", "show", run["id"])
    assert shown["status"] == "done", shown
    out = dev.json("runs", "steps", run["id"])
    text = json.dumps(out)
    assert TENANT_TOKEN not in text
    assert ADMIN_TOKEN not in text
    assert password not in text
    assert "listed no such dir" in text or "listed []" in text
    assert "answer R 10" in text, text[-2000:]  # SASL: the password is wanted


def _children(pid: int, *, named: str) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields[1]) == pid and named in cmdline:
            found.append(int(stat.parent.name))
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_no_dev_worker_outlives_a_killed_dev(dev: Dev) -> None:
    """kill -9 of `runlease dev` (what this file's fixture does at the end):
    its workers used to live on, orphaned, retrying a database that was gone."""
    assert dev.proc is not None
    workers = _children(dev.proc.pid, named="runlease worker")
    assert workers, "runlease dev started no worker"
    dev.proc.kill()
    dev.proc.wait(10)
    until_sync(lambda: not any(_running(p) for p in workers), timeout_s=30,
               what="the dev stack's workers to exit after it was killed")
