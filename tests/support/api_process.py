"""`runlease api` as its own process, for tests that kill and restart it."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

from runlease.db.embedded import free_port
from tests.support.api import ADMIN_TOKEN, TOKENS
from tests.support.proc import ChildProcess, child_env
from tests.support.waiting import until_sync


class ApiProcess(ChildProcess):
    """`python -m runlease api` on a fixed port, so a restart serves the same URL."""

    def __init__(self, database_url: str, log_dir: Path, name: str = "api",
                 port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = child_env(database_url)
        env.update({
            "RUNLEASE_PORT": str(self.port),
            "RUNLEASE_TOKENS": ",".join(f"{t}={token}" for t, token in TOKENS.items()),
            "RUNLEASE_ADMIN_TOKENS": ADMIN_TOKEN,
            "RUNLEASE_SSE_POLL_S": "0.2",
            "RUNLEASE_SSE_KEEPALIVE_S": "1",
        })
        super().__init__(log_dir / f"{name}.log", env)

    def start(self, *, wait: bool = True) -> ApiProcess:
        self._spawn([sys.executable, "-m", "runlease", "api"])
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
