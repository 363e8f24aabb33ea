"""The README's and docs' `doc-test: dev` blocks, run as written against
`runlease dev` on the embedded default (started with the documented
`doc-test: dev-server` command), one command at a time: each must succeed.
`<id>` is the id of the run the last submit printed, as a reader would paste
it. `.venv/bin/runlease` and `runlease` are this checkout's CLI; the
documented http://127.0.0.1:8080 becomes the test's port."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runlease.db.embedded import free_port
from tests.docs.blocks import ROOT, Block, command_blocks
from tests.support.waiting import until_sync

pytestmark = pytest.mark.slow

DOC_URL = "http://127.0.0.1:8080"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SUBMITS = (re.compile(r"\bruns submit\b"), re.compile(r"-X POST \S*/v1/runs\s"))


class Reader:
    """A shell in a scratch folder with this checkout's `runlease`."""

    def __init__(self, home: Path, url: str) -> None:
        self.home, self.url = home, url
        bin_dir = home / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        shim = bin_dir / "runlease"
        shim.write_text(f"#!/bin/sh\nexec {sys.executable} -P -m runlease \"$@\"\n")
        shim.chmod(0o755)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("RUNLEASE_") and k != "DATABASE_URL"}
        self.env |= {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                     "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
                     "RUNLEASE_API_URL": url}
        self.preamble: list[str] = []  # exports and assignments seen so far
        self.last_id: str | None = None

    def run_sh(self, block: Block) -> None:
        for command in block.commands():
            command = command.replace(DOC_URL, self.url)
            if "<id>" in command:
                assert self.last_id, f"{block.where}: {command!r} needs a submitted run"
                command = command.replace("<id>", self.last_id)
            if re.fullmatch(r"(export )?[A-Z_]+=\S+", command):
                self.preamble.append(command)
                continue
            script = "\n".join([*self.preamble, command])
            result = subprocess.run(["bash", "-euc", script], cwd=self.home, env=self.env,
                                    capture_output=True, text=True, timeout=60, check=False)
            assert result.returncode == 0, (
                f"{block.where}: {command}\nexit {result.returncode}\n"
                f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
            assert '"error"' not in result.stdout or "cancel" in command, (
                f"{block.where}: {command}\n{result.stdout[-2000:]}")
            if any(p.search(command) for p in SUBMITS):
                found = UUID.search(result.stdout)
                assert found, f"{block.where}: {command} printed no run id"
                self.last_id = found.group(0)

    def run_python(self, block: Block) -> str:
        source = block.text.replace(DOC_URL, self.url)
        result = subprocess.run([sys.executable, "-P", "-c", source], cwd=self.home,
                                env=self.env, capture_output=True, text=True, timeout=60,
                                check=False)
        assert result.returncode == 0, f"{block.where}:\n{result.stderr[-3000:]}"
        return result.stdout


@pytest.fixture
def dev() -> Iterator[str]:
    # Not tmp_path: PostgreSQL runs as another user and must reach its data.
    tmp_path = Path(tempfile.mkdtemp(prefix="runlease-docs-"))
    tmp_path.chmod(0o755)
    [server] = command_blocks("dev-server")
    [command] = server.commands()
    args = shlex.split(command)
    # Leading NAME=value words are the command's environment (its tokens).
    given = {}
    while args and "=" in args[0] and not args[0].startswith((".", "/")):
        name, _, value = args.pop(0).partition("=")
        given[name] = value
    assert args[:2] == [".venv/bin/runlease", "dev"], server.where
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | given
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    log = (tmp_path / "dev.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-P", "-m", "runlease", *args[1:],
                             "--port", str(port), "--data-dir", str(tmp_path / "data"),
                             "--workers", "1"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, (tmp_path / "dev.log").read_text()
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        until_sync(ready, timeout_s=60, what="runlease dev")
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_the_documented_commands_work_against_runlease_dev(dev: str, tmp_path: Path) -> None:
    reader = Reader(tmp_path / "reader", dev)
    ran = 0
    for block in command_blocks("dev"):
        if block.lang == "python":
            printed = reader.run_python(block)
            if "print(event)" in block.text:  # the doc shows events printed
                assert "StreamEvent(" in printed, printed
                assert "RunEnded(" in printed, printed
        else:
            reader.run_sh(block)
        ran += 1
    assert ran >= 3
