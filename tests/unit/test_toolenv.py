"""The rules of a tool's environment (worker/toolenv.py), on a worker that
has not sealed (its os.environ is its start environment)."""

from __future__ import annotations

import os

import pytest

from runlease.worker import toolenv

URL = "postgresql://runlease:dbpassword1@db:5432/runlease"


@pytest.fixture(autouse=True)
def worker_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in {"PATH": "/usr/bin:/bin", "HOME": "/work", "LANG": "C.UTF-8",
                        "LC_TIME": "C", "TMPDIR": "/tmp", "RUNLEASE_DATABASE_URL": URL,
                        "RUNLEASE_POOL": "default", "OPENAI_API_KEY": "modelkey0123456789",
                        "GITHUB_TOKEN": "ghp_workertoken1", "PLAIN": "plain-value",
                        "HTTPS_PROXY": "http://proxy:3128"}.items():
        monkeypatch.setenv(name, value)


def test_a_tool_gets_the_allowlist_and_its_run_only() -> None:
    env = toolenv.build(None, run_env=toolenv.run_vars("r1", 2, 5))
    assert env == {"PATH": "/usr/bin:/bin", "HOME": "/work", "LANG": "C.UTF-8", "LC_TIME": "C",
                   "TMPDIR": "/tmp", "RUNLEASE_RUN_ID": "r1", "RUNLEASE_ATTEMPT": "2",
                   "RUNLEASE_LEASE_EPOCH": "5"}


def test_passing_the_workers_environment_adds_nothing() -> None:
    assert toolenv.build(dict(os.environ)) == toolenv.build(None)


def test_what_the_agent_sets_passes_but_the_deny_side_never() -> None:
    env = toolenv.build({
        "PATH": "/opt/tool/bin",              # an allowlisted name, another value: the agent's
        "GITHUB_TOKEN": "the-tenants-token",  # the worker's secret name: refused, any value
        "MY_TOKEN": "tenant-token-2",         # a name of the agent's own
        "RUNLEASE_POOL": "other",             # the worker's configuration
        "RUNLEASE_ANYTHING": "x",             # the whole RUNLEASE_ space but the run variables
        "RUNLEASE_STEP": "3",
        "DATABASE_URL": "postgresql://elsewhere/db",  # a setting's variable, even if unset
        "COPY": f"url={URL}",                 # a worker secret's value inside another
        "KEY_AGAIN": "Bearer modelkey0123456789",
    })
    assert {k: env[k] for k in ("PATH", "MY_TOKEN", "RUNLEASE_STEP")} == {
        "PATH": "/opt/tool/bin", "MY_TOKEN": "tenant-token-2", "RUNLEASE_STEP": "3"}
    assert not {"GITHUB_TOKEN", "RUNLEASE_POOL", "RUNLEASE_ANYTHING", "DATABASE_URL", "COPY",
                "KEY_AGAIN"} & set(env)


def test_a_grant_passes_a_worker_variable_but_never_the_database_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ALIAS", f"the url: {URL}")  # the database under another name
    grant = frozenset({"GITHUB_TOKEN", "HTTPS_PROXY", "NOT_SET", "RUNLEASE_DATABASE_URL",
                       "ALIAS"})
    env = toolenv.build({"GH": "token=ghp_workertoken1"}, grant=grant)
    assert "ALIAS" not in env
    assert env["GITHUB_TOKEN"] == "ghp_workertoken1"
    assert env["HTTPS_PROXY"] == "http://proxy:3128"
    assert env["GH"] == "token=ghp_workertoken1"  # a granted value is no longer a secret
    assert "NOT_SET" not in env
    assert "RUNLEASE_DATABASE_URL" not in env
    assert toolenv.check_grant(grant) == grant - {"RUNLEASE_DATABASE_URL"}
    assert "COPY" not in toolenv.build({"COPY": URL}, grant=grant)
    assert "PLAIN" not in env
    assert "OPENAI_API_KEY" not in env
