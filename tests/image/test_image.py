"""The built image, used the way the chart and the operator use it.

PostgreSQL runs on the host (the embedded server of tests/conftest.py, TCP on
127.0.0.1); the image's `runlease migrate`, `runlease api` and `runlease
worker` run in containers on the host's network, as the image's non-root user,
with a read-only root filesystem and a tmpfs on /tmp (the pods' emptyDir). A
script-agent run submitted over HTTP is done through them, and SIGTERM stops
each within its pod's grace. scripts/build-image builds the image; without one
these tests skip (fail under CI=true).
"""

from __future__ import annotations

import os
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from runlease.db.embedded import free_port
from tests.image.engine import Engine, configured
from tests.support.otlp import OtlpReceiver
from tests.support.waiting import until_sync

ROOT = Path(__file__).resolve().parents[2]
VALUES = yaml.safe_load((ROOT / "charts" / "runlease" / "values.yaml").read_text())
UID = 10001  # the Dockerfile's USER and the chart's runAsUser
TOKEN = "image-smoke-token-0123456789"
ADMIN_TOKEN = "image-smoke-admin-0123456789"
# The operator's worker pod defaults (runlease.operator.spec): 60 s to stop,
# of which drainGraceSeconds (25 by default; shorter here) for running runs.
WORKER_GRACE_S = 60
DRAIN_GRACE_S = 3
SIGKILLED = 137


@pytest.fixture(scope="module")
def engine() -> Engine:
    config = configured()
    if "RUNLEASE_IMAGE" not in config:
        message = "no image built: scripts/build-image builds one (.runlease/image.env)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI builds it first (.ci/run)")
        pytest.skip(message)
    found = Engine.from_config(config)
    present = found("image", "inspect", found.image, check=False)
    assert present.returncode == 0, (
        f"{found.image} is not in {found.command}'s images: run scripts/build-image\n"
        f"{present.stderr}")
    return found


def test_the_image_runs_as_the_chart_expects(engine: Engine) -> None:
    assert engine.inspect(engine.image, "{{.Config.User}}") == f"{UID}:{UID}"
    assert engine.inspect(engine.image, "{{json .Config.Entrypoint}}") == '["runlease"]'
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert engine.inspect(
        engine.image, '{{index .Config.Labels "org.opencontainers.image.version"}}') == version
    shown = engine.run("--version")
    assert shown.stdout.strip() == f"runlease, version {version}"


def test_no_compiler_no_pip_cache_and_the_base_ca_bundle(engine: Engine) -> None:
    script = r"""
        for tool in gcc cc c++ g++ clang make ld as; do
            command -v "$tool" && echo "compiler: $tool"
        done
        for dir in /root/.cache /home/runlease/.cache /dist /src; do
            [ -e "$dir" ] && echo "left over: $dir"
        done
        find / -xdev \( -path /proc -o -path /sys \) -prune -o \
            \( -name '*.whl' -path '*runlease*' -o -type d -name pip -path '*/.cache/*' \) \
            -print | sed 's/^/left over: /'
        ls /opt/runlease/lib/python3.11/site-packages | grep -i '^runlease-.*\.dist-info$'
        sha256sum /etc/ssl/certs/ca-certificates.crt
    """
    out = engine.run("-c", script, options=("--user", "0"), entrypoint="sh").stdout
    assert "compiler:" not in out, out
    assert "left over:" not in out, out
    assert "runlease-" in out, out  # the listing saw the virtualenv: the checks looked
    image_ca = out.split()[-2]
    assert engine.base, "no base image recorded (scripts/build-image records it)"
    base_ca = engine.run("/etc/ssl/certs/ca-certificates.crt", image=engine.base,
                         entrypoint="sha256sum").stdout.split()[0]
    # The host's bundle is mounted over it while RUN steps install: it must
    # not have been written into a layer.
    assert image_ca == base_ca


def test_pip_check_passes_inside(engine: Engine) -> None:
    out = engine.run("check", entrypoint="pip")
    assert "No broken requirements found" in out.stdout


def test_the_operator_starts(engine: Engine) -> None:
    out = engine.run("operator", "--help")
    assert "Usage: runlease operator" in out.stdout


def _client(port: int, token: str) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{port}",
                        headers={"Authorization": f"Bearer {token}"}, timeout=10)


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _run(api: httpx.Client, run_id: str) -> dict[str, Any]:
    response = api.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _uid_of_pid1(engine: Engine, name: str) -> int:
    status = engine("exec", name, "cat", "/proc/1/status").stdout
    uids = next(line for line in status.splitlines() if line.startswith("Uid:"))
    return int(uids.split()[1])


def _stop(engine: Engine, name: str, grace_s: int) -> int:
    """SIGTERM, then SIGKILL after grace_s, as the kubelet does: the exit code."""
    engine("stop", "--time", str(grace_s), name, timeout=grace_s + 60)
    assert engine.inspect(name, "{{.State.Running}}") == "false"
    return int(engine.inspect(name, "{{.State.ExitCode}}"))


@pytest.fixture
def containers(engine: Engine) -> Iterator[str]:
    prefix = f"runlease-smoke-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    yield prefix
    for role in ("api", "worker"):
        engine("rm", "-f", f"{prefix}-{role}", check=False)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def test_a_run_through_the_api_and_worker_containers(
    engine: Engine, empty_db_url: str, containers: str, receiver: OtlpReceiver,
) -> None:
    db = ("-e", f"RUNLEASE_DATABASE_URL={empty_db_url}", "-e", "RUNLEASE_LOG_JSON=true")
    # The chart's migrations Job: the schema from nothing.
    migrated = engine.run("migrate", options=db)
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regclass('agent_runs')").fetchone() == ("agent_runs",), (
            migrated.stdout + migrated.stderr)

    api_port, metrics_port, pod_uid = free_port(), free_port(), f"pod-{uuid.uuid4()}"
    api_grace = int(VALUES["api"]["terminationGracePeriodSeconds"])
    with engine.container(
        f"{containers}-api", *db, "-e", f"RUNLEASE_TOKENS=acme={TOKEN}",
        "-e", f"RUNLEASE_ADMIN_TOKENS={ADMIN_TOKEN}",
        "-e", "RUNLEASE_STREAM_TOKEN_SECRET=image-smoke-stream-secret-0123456789",
        args=["api", "--host", "127.0.0.1", "--port", str(api_port)],
    ) as api_name, engine.container(
        # --init: the worker pod shares its process namespace, so PID 1 is
        # the pause process, which reaps orphaned tool processes.
        f"{containers}-worker", "--init", *engine.sandbox_options(), *db,
        "-e", f"POD_UID={pod_uid}",
        "-e", "RUNLEASE_AGENT=runlease.agents.script:agent",
        "-e", f"RUNLEASE_METRICS_PORT={metrics_port}",
        "-e", f"RUNLEASE_DRAIN_GRACE_S={DRAIN_GRACE_S}",
        # The image has the otel extra: its worker exports its spans (to
        # the test's receiver, on the host's network) when asked to.
        *(part for k, v in receiver.env().items() for part in ("-e", f"{k}={v}")),
        args=["worker"],
    ) as worker_name:
        def logs() -> str:
            return (f"--- api ---\n{engine.logs(api_name)}\n"
                    f"--- worker ---\n{engine.logs(worker_name)}")

        until_sync(lambda: _ready(f"http://127.0.0.1:{api_port}/readyz"), timeout_s=60,
                   what=f"the API container to be ready\n{logs()}")
        until_sync(lambda: _ready(f"http://127.0.0.1:{metrics_port}/readyz"), timeout_s=60,
                   what=f"the worker container to be ready\n{logs()}")
        assert _uid_of_pid1(engine, api_name) == UID

        with _client(api_port, TOKEN) as api, _client(api_port, ADMIN_TOKEN) as admin:
            # A tool writes to /tmp (the tmpfs) and reads its own uid.
            steps = [{"emit": {"text": "hello from the image"}},
                     {"shell": ["sh", "-c", "id -u >/tmp/uid && cat /tmp/uid"]},
                     # In its sandbox: bwrap is PID 1 of the tool's namespace.
                     {"shell": ["sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline"]}]
            created = api.post("/v1/runs", json={"input": {"steps": steps}})
            assert created.status_code == 201, created.text
            run_id = created.json()["id"]
            done = until_sync(
                lambda: (r := _run(api, run_id))["status"] in {"done", "dead"} and r,
                timeout_s=120, what=f"the run to finish\n{logs()}")
            assert done["status"] == "done", (done, logs())
            with psycopg.connect(empty_db_url) as conn:
                row = conn.execute("SELECT result FROM agent_run_steps WHERE run_id = %s"
                                   " AND step_key = '1'", (run_id,)).fetchone()
            assert row is not None
            assert row[0]["stdout"].strip() == str(UID)
            with psycopg.connect(empty_db_url) as conn:
                pid1 = conn.execute("SELECT result FROM agent_run_steps WHERE run_id = %s"
                                    " AND step_key = '2'", (run_id,)).fetchone()
            assert pid1 is not None
            assert "bwrap" in pid1[0]["stdout"], pid1
            attempt = until_sync(lambda: receiver.spans(name="attempt"), timeout_s=30,
                                 what=f"the worker's attempt span exported\n{logs()}")[0]
            assert attempt.service == "runlease-worker"
            assert attempt.attributes["runlease.run_id"] == run_id
            # Its tools' spans are the attempt's children (the API traces
            # nothing here: the attempt is the trace's root).
            tools = until_sync(lambda: len(t := receiver.spans(
                name="tool", trace_id=attempt.trace_id)) == 2 and t, timeout_s=30,
                what=f"the tool spans exported\n{logs()}")
            assert {t.parent_span_id for t in tools} == {attempt.span_id}

            # A run in flight when the worker gets SIGTERM: released within
            # the drain grace (its tool killed), and the container exits by
            # itself before the pod's grace is up.
            long = api.post("/v1/runs", json={"input": {"steps": [{"shell": ["sleep", "600"]}]}})
            assert long.status_code == 201, long.text
            long_id = long.json()["id"]
            leased = until_sync(
                lambda: (r := _run(admin, long_id))["status"] == "leased" and r,
                timeout_s=60, what=f"the worker to claim the long run\n{logs()}")
            assert leased["lease"]["locked_by"].startswith(f"{pod_uid}:")
            code = _stop(engine, worker_name, WORKER_GRACE_S)
            assert code == 0, f"the worker exited {code}\n{logs()}"
            released = _run(api, long_id)
            assert (released["status"], released["attempts"]) == ("pending", 0), released

            code = _stop(engine, api_name, api_grace)
            assert code == 0, f"the API exited {code}\n{logs()}"
