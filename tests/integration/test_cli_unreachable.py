"""A wrong or down API URL: `runs tail` and the SDK's events() used to
retry in silence forever; every command now fails at once in one line that
names the URL. And `runs tail` exits by how the run ended, as `kubectl
wait` does (0 done, 3 dead, 4 cancelled)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys

import httpx
import pytest
from click.testing import CliRunner, Result

from runlease.cli import main as cli
from runlease.client import AsyncClient, Client
from runlease.db.store import NewRun, RunStore
from tests.support.api import Api
from tests.support.proc import ROOT

RUN_ID = "01a2b3c4-0000-7000-8000-000000000000"


def closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_command_names_the_url_it_cannot_reach() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLEASE_")}
    env |= {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "RUNLEASE_API_URL": url, "RUNLEASE_TOKEN": "acme-token-0123456789"}
    for args in (("runs", "tail", RUN_ID), ("runs", "list"), ("runs", "show", RUN_ID)):
        # Before, `runs tail` never returned: the timeout here would fail the test.
        result = subprocess.run([sys.executable, "-m", "runlease", *args], env=env,
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 1, (args, result)
        assert "Traceback" not in result.stderr
        [line] = result.stderr.splitlines()
        assert line.startswith(f"error: cannot reach the API at {url}"), line


def test_sdk_events_raise_when_the_api_was_never_reached() -> None:
    with Client(f"http://127.0.0.1:{closed_port()}", "t" * 20) as api, \
            pytest.raises(httpx.ConnectError):
        next(iter(api.events(RUN_ID)))


async def test_async_sdk_events_raise_when_the_api_was_never_reached() -> None:
    async with AsyncClient(f"http://127.0.0.1:{closed_port()}", "t" * 20) as api:
        with pytest.raises(httpx.ConnectError):
            async for _ in api.events(RUN_ID):
                pass


async def tail(api: Api, run_id: str, *more: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke, cli, ["runs", "tail", run_id, *more, "--api-url", api.url,
                                  "--token", api.token("acme")])


async def test_tail_exits_by_how_the_run_ended(api: Api, live_store: RunStore) -> None:
    await live_store.enqueue_many("default", [NewRun("acme", {}) for _ in range(2)])
    dead, done = await live_store.claim("default", "test-worker", 2)
    await live_store.fail(dead, "refused", "no")
    await live_store.ack(done, {})
    cancelled = await live_store.enqueue("default", "acme", {})
    await live_store.request_cancel(cancelled.run.id)
    ended = await tail(api, str(dead.run_id))
    assert ended.exit_code == 3, ended.output
    assert "end: dead (refused)" in ended.output
    ended = await tail(api, str(done.run_id), "-o", "json")
    assert ended.exit_code == 0, ended.output
    assert json.loads(ended.stdout.splitlines()[-1])["status"] == "done"
    ended = await tail(api, str(cancelled.run.id))
    assert ended.exit_code == 4, ended.output
