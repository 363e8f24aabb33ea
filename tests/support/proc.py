"""Processes for tests: real `runlease worker` (and `runlease api`) subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def processes_with(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def child_env(database_url: str) -> dict[str, str]:
    """The test process's environment without RUNLEASE_* settings, this tree's
    code first (the virtualenv's editable install may point at another
    checkout), and the database URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLEASE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env["RUNLEASE_DATABASE_URL"] = database_url
    return env


class ChildProcess:
    """A `python -m runlease ...` subprocess in a session of its own, logging to a file."""

    def __init__(self, log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self, argv: list[str]) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(argv, env=self.env, cwd=ROOT, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        """kill -9 of the process only, as an OOM kill would (a worker's tools'
        guards, worker/toolguard.py, then kill its tools)."""
        self.signal(signal.SIGKILL)
        self.wait(10)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def cleanup(self) -> None:
        """Kill the process and everything in its session."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class WorkerProcess(ChildProcess):
    """`python -m runlease worker` with settings from RUNLEASE_* variables."""

    def __init__(self, database_url: str, log_dir: Path, name: str,
                 settings: Mapping[str, object]) -> None:
        self.name = name
        env = child_env(database_url)
        env.update({"RUNLEASE_METRICS_PORT": "0", "POD_UID": f"pod-{name}"})
        for key, value in settings.items():
            env["RUNLEASE_" + key.upper()] = str(value).lower() if isinstance(value, bool) \
                else str(value)
        super().__init__(log_dir / f"{name}.log", env)
        self.argv_prefix: list[str] = []  # e.g. setpriv, to start it with fewer privileges
        self.python = sys.executable  # another for a uid that cannot run this one

    def start(self) -> WorkerProcess:
        self._spawn([*self.argv_prefix, self.python, "-m", "runlease", "worker"])
        return self

    @property
    def identity_prefix(self) -> str:
        return f"pod-{self.name}:"
