"""The CLI as a newcomer meets it: errors in one line that name the option
and the fix (the traceback only with --log-level DEBUG), an agent imported
from the working directory, and an API that says where it listens."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runlease.db.embedded import free_port
from tests.support.proc import ROOT
from tests.support.waiting import until_sync

NO_DB = "postgresql://nobody@127.0.0.1:1/nothing"


def runlease(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """The command as installed: -P, since `python -m` would put the working
    directory on the import path itself, which the `runlease` script does not."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("RUNLEASE_", "KUBE")) and k != "DATABASE_URL"}
    environ |= {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])} | env
    return subprocess.run([sys.executable, "-P", "-m", "runlease", *args], env=environ, cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=False)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def test_a_busy_port_is_one_line_with_the_fix(busy_port: int, tmp_path: Path) -> None:
    api = one_line_error(runlease("api", "--port", str(busy_port), "--database-url", NO_DB,
                                  "--tokens", "acme=0123456789abcdef"))
    assert f"127.0.0.1:{busy_port} is already in use" in api
    assert "--port (RUNLEASE_PORT)" in api
    dev = one_line_error(runlease("dev", "--port", str(busy_port), "--data-dir",
                                  str(tmp_path / "data")))
    assert "already in use" in dev
    assert not (tmp_path / "data").exists()  # nothing was started
    debug = runlease("--log-level", "DEBUG", "api", "--port", str(busy_port),
                     "--database-url", NO_DB)
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr


def test_settings_errors_name_the_option_and_its_variable() -> None:
    short = one_line_error(runlease("api", "--database-url", NO_DB, "--tokens", "acme=short"))
    assert "--tokens (RUNLEASE_TOKENS)" in short
    assert "16 characters" in short
    env = one_line_error(runlease("api", "--database-url", NO_DB,
                                  RUNLEASE_ADMIN_TOKENS="short"))
    assert "--admin-tokens (RUNLEASE_ADMIN_TOKENS)" in env
    nodb = one_line_error(runlease("worker", "--agent", "runlease.agents.script:agent"))
    assert "DATABASE_URL" in nodb


def test_dev_checks_its_tokens_before_starting_anything(tmp_path: Path) -> None:
    # Through the environment: on its command line dev refuses a token outright.
    for option, variable, value in (("--token", "RUNLEASE_DEV_TOKENS", "acme=short"),
                                    ("--admin-token", "RUNLEASE_ADMIN_TOKEN", "short")):
        result = runlease("dev", "--data-dir", str(tmp_path / "data"), **{variable: value})
        assert result.returncode == 2, result
        assert f"Invalid value for {option}: tokens must be at least 16" in result.stderr
        assert not (tmp_path / "data").exists()


def test_operator_without_a_cluster_is_one_line(tmp_path: Path) -> None:
    line = one_line_error(runlease("operator", "--namespaces", "agents", "--standalone",
                                   HOME=str(tmp_path)))
    assert "no Kubernetes cluster" in line
    assert "KUBECONFIG" in line
    assert "runlease dev" in line
    missing = one_line_error(runlease("operator", "--all-namespaces", "--standalone",
                                      KUBECONFIG=str(tmp_path / "nope")))
    assert f"KUBECONFIG={tmp_path / 'nope'}" in missing


def test_worker_imports_the_agent_from_its_working_directory(tmp_path: Path) -> None:
    (tmp_path / "myagents.py").write_text(
        "def plain(ctx):\n    return {}\n\n\nasync def agent(ctx):\n    return {}\n")
    sync = one_line_error(runlease("worker", "--agent", "myagents:plain", "--database-url",
                                   NO_DB, cwd=tmp_path))
    assert "--agent (RUNLEASE_AGENT)" in sync
    assert "not an async function" in sync
    # Found in the working directory: the module imports (it has no `nothing`).
    found = one_line_error(runlease("worker", "--agent", "myagents:nothing",
                                    "--database-url", NO_DB, cwd=tmp_path))
    assert "myagents has no 'nothing'" in found
    elsewhere = one_line_error(runlease("worker", "--agent", "myagents:nothing",
                                        "--database-url", NO_DB, "--app-dir", str(ROOT),
                                        cwd=tmp_path))
    assert "cannot import agent module 'myagents'" in elsewhere
    from_app_dir = one_line_error(runlease("worker", "--agent", "myagents:plain",
                                           "--database-url", NO_DB, "--app-dir",
                                           str(tmp_path)))
    assert "not an async function" in from_app_dir


def test_api_says_where_it_listens_and_warns_without_tokens(db_url: str) -> None:
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RUNLEASE_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    proc = subprocess.Popen([sys.executable, "-m", "runlease", "api", "--port", str(port),
                             "--database-url", db_url], env=environ,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        until_sync(lambda: f"api_listening url=http://127.0.0.1:{port}" in "".join(lines),
                   what="the listen address in the log")
        until_sync(lambda: "api_no_tokens" in "".join(lines), what="the no-token warning")
    finally:
        proc.terminate()
        proc.wait(20)
        reader.join(5)
        proc.stderr.close()
    assert "--tokens" in "".join(lines)


def test_the_operators_busy_metrics_port_is_one_line(busy_port: int) -> None:
    line = one_line_error(runlease("operator", "--namespaces", "agents",
                                   "--metrics-host", "127.0.0.1",
                                   "--metrics-port", str(busy_port)))
    assert f"--metrics-port (RUNLEASE_METRICS_PORT): 127.0.0.1:{busy_port} is already in use" \
        in line


def test_a_busy_metrics_port_is_one_line(busy_port: int, db_url: str) -> None:
    line = one_line_error(runlease("worker", "--agent", "runlease.agents.script:agent",
                                   "--database-url", db_url, "--metrics-host", "127.0.0.1",
                                   "--metrics-port", str(busy_port)))
    assert f"--metrics-port (RUNLEASE_METRICS_PORT): 127.0.0.1:{busy_port} is already in use" \
        in line
