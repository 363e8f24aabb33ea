"""`runlease dev` safe by default, the parts that need no server (runlease/dev.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runlease import dev
from runlease.worker import sandbox


def test_the_workers_get_no_token_and_tools_never_see_the_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RUNLEASE_DEV_TOKENS", "acme=tenant-token-0123456789")
    monkeypatch.setenv("RUNLEASE_ADMIN_TOKEN", "admin-token-0123456789")
    monkeypatch.setenv("RUNLEASE_TOOL_HIDE_PATHS", "/srv/mine")
    fleet = dev.WorkerFleet("postgresql://postgres:pw@127.0.0.1:5/postgres", 1, 1, 1.0,
                            tmp_path)
    env = fleet.env()
    assert not set(dev.TOKEN_VARS) & set(env)
    assert "token-0123456789" not in "".join(env.values())
    assert env["RUNLEASE_TOOL_HIDE_PATHS"] == f"/srv/mine,{tmp_path}"
    assert "RUNLEASE_TOOL_SANDBOX" not in env  # sandboxed: the worker's default
    unsandboxed = dev.WorkerFleet("x", 1, 1, 1.0, tmp_path, sandboxed=False).env()
    assert (unsandboxed["RUNLEASE_TOOL_SANDBOX"], unsandboxed["RUNLEASE_UNSANDBOXED_POOL"]) == (
        "false", "default")


def test_sealing_takes_the_tokens_out_of_the_environment(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNLEASE_ADMIN_TOKEN", "admin-token-0123456789")
    monkeypatch.setattr(dev.toolenv, "non_dumpable", lambda: True)  # not this test process
    dev.seal_tokens()
    assert "RUNLEASE_ADMIN_TOKEN" not in os.environ


def test_without_bwrap_the_banner_has_a_reason_to_warn(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sandbox.shutil, "which", lambda *_, **__: None)
    problem = dev.sandbox_problem(tmp_path)
    assert problem is not None
    assert "bwrap" in problem


def test_the_banner_shows_no_password() -> None:
    shown = dev.without_password("postgresql://postgres:s3cret-pass@127.0.0.1:5432/postgres")
    assert shown == "postgresql://postgres:***@127.0.0.1:5432/postgres"
    assert dev.without_password("postgresql://postgres@h/db") == "postgresql://postgres@h/db"
