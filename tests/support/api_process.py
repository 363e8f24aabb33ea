"""`runlease api` as its own process, for tests that kill and restart it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from runlease.db.embedded import free_port
from tests.support.api import ADMIN_TOKEN, TOKENS
from tests.support.proc import ROOT
from tests.support.waiting import until_sync


class ApiProcess:
    """`python -m runlease api` on a fixed port, so a restart serves the same URL."""

    def __init__(self, database_url: str, log_dir: Path, name: str = "api",
                 port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLEASE_")}
        env.update({
            "PYTHONPATH": str(ROOT),
            "RUNLEASE_DATABASE_URL": database_url,
            "RUNLEASE_PORT": str(self.port),
            "RUNLEASE_TOKENS": ",".join(f"{t}={token}" for t, token in TOKENS.items()),
            "RUNLEASE_ADMIN_TOKENS": ADMIN_TOKEN,
            "RUNLEASE_SSE_POLL_S": "0.2",
            "RUNLEASE_SSE_KEEPALIVE_S": "1",
        })
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, wait: bool = True) -> ApiProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runlease", "api"], env=self.env, cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        if wait:
            until_sync(self.serving, timeout_s=60, what=f"the API on port {self.port}")
        return self

    def serving(self) -> bool:
        """Answers HTTP (the database may be down: /healthz does not ask it)."""
        assert self.proc is not None
        assert self.proc.poll() is None, f"the API exited:\n{self.log()}"
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait(10)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def cleanup(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
