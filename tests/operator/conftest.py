"""The operator against KMock (an in-memory Kubernetes API) and a real PostgreSQL.

kopf runs in its own thread and event loop, so KMock keeps serving from the
test's loop and kopf never mistakes the test's tasks for its own. Test
objects carry uid, generation and resourceVersion, which KMock does not set.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from runlease.operator.main import kopf_settings, operator
from runlease.settings import OperatorSettings, load
from tests.support.waiting import eventually

NS = "rl-test"
POOLS = "runlease.dev/v1alpha1/agentrunpools"
POOLS_URL = f"/apis/runlease.dev/v1alpha1/namespaces/{NS}/agentrunpools"
DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
PDBS = "policy/v1/poddisruptionbudgets"
PODS = "v1/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}


def requests_of(kmock: Any, *, method: str | None = None, resource: str | None = None,
                name: str | None = None, subresource: Any = ...) -> list[Any]:
    out = []
    for r in list(kmock):
        if method is not None and r.method != method.upper():
            continue
        if resource is not None and r.resource != resource:
            continue
        if name is not None and r.name != name:
            continue
        if subresource is not ... and r.subresource != subresource:
            continue
        out.append(r)
    return out


def stored(kmock: Any, resource: str, name: str, ns: str = NS) -> dict[str, Any]:
    obj = kmock.objects[resource, ns, name]
    assert not obj.deleted, f"{resource}/{name} is deleted"
    return dict(obj.raw)


@pytest.fixture
def kubeconfig(kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    kmock.resources.load_bundled()
    kmock.resources[POOLS] = kmock.ResourceInfo(
        kind="AgentRunPool", singular="agentrunpool", shortnames={"arp"}, namespaced=True,
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        subresources={"status"})
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "kmock", "user": {"token": "test-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock",
                                                   "namespace": NS}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return str(path)


def database_secret(kmock: Any, db_url: str, name: str = "db", ns: str = NS) -> None:
    kmock.objects["v1/secrets", ns, name] = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-secret-{ns}-{name}"},
        "data": {"url": base64.b64encode(db_url.encode()).decode()},
    }


def pool_body(name: str, ns: str = NS, **spec: Any) -> dict[str, Any]:
    uid = f"uid-{name}" if ns == NS else f"uid-{ns}-{name}"
    return {
        "apiVersion": "runlease.dev/v1alpha1", "kind": "AgentRunPool",
        "metadata": {"name": name, "namespace": ns, "uid": uid, "generation": 1,
                     "resourceVersion": "1"},
        "spec": {"image": "ghcr.io/acme/agents:1.2", "agent": "acme.agents:main",
                 "database": {"secretKeyRef": {"name": "db"}}} | spec,
    }


def kopf_test_settings() -> kopf.OperatorSettings:
    config = load(OperatorSettings, {"namespaces": NS, "standalone": True}, environ={})
    settings = kopf_settings(config)
    settings.scanning.disabled = True  # KMock answers 500 to namespace listing
    settings.process.ultimate_exiting_timeout = None  # never SIGKILL the test process
    settings.networking.error_backoffs = [0.1, 0.2]
    return settings


@contextlib.asynccontextmanager
async def running_operator(kmock: Any, db_url: str | None = None,
                           **overrides: Any) -> AsyncIterator[OperatorSettings]:
    values = {"namespaces": NS, "standalone": True, "interval_s": 0.3, "metrics_port": 0,
              "reaper_interval_s": 0.3, "leader_ttl_s": 2, "database_url": db_url} | overrides
    config = load(OperatorSettings, values, environ={})
    stop = threading.Event()
    errors: list[BaseException] = []

    async def main() -> None:
        task = asyncio.create_task(operator(config, settings=kopf_test_settings(),
                                            stop_flag=stop))
        waiter = asyncio.ensure_future(asyncio.to_thread(stop.wait))
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        await waiter
        # A graceful stop, as on SIGTERM: kopf gives a worker in a retry delay
        # its queueing.exit_timeout (2 s) and then cleans up; cancelling it
        # before then left services running and the thread hanging, now and then.
        done, _ = await asyncio.wait({task}, timeout=10)
        if not done:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # re-raised in the test
            errors.append(exc)

    logging.getLogger("kopf").setLevel(logging.WARNING)
    thread = threading.Thread(target=run, daemon=True, name="kopf")
    thread.start()
    try:
        await eventually(lambda: requests_of(kmock, method="GET", resource=POOLS), wait_s=15)
        yield config
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 15)
        assert not thread.is_alive(), "the operator did not stop"
        if errors:
            raise errors[0]


async def create_pool(kmock: Any, name: str, ns: str = NS, **spec: Any) -> dict[str, Any]:
    body = pool_body(name, ns, **spec)
    url = f"/apis/runlease.dev/v1alpha1/namespaces/{ns}/agentrunpools"
    response = await kmock.post(url, json=body)
    assert response.status < 300, await response.text()
    return body
