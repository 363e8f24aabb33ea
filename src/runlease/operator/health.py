"""The operator's /healthz and /readyz, on its metrics port.

    /healthz  kopf is alive: its orchestrator task runs and, once kopf has
              started, at least one of its watch streams. The probe server
              runs on kopf's event loop, so a blocked loop answers nothing
              and the kubelet's probe times out as well.
    /readyz   kopf has started, the API server answers (a list of one
              AgentRunPool, which the operator's RBAC allows), and so does
              every database the operator serves (its own and each pool's).

kopf exposes no liveness of its own without its separate liveness endpoint,
so its tasks are found by the names kopf 1.x gives them; a kopf that renames
them fails tests/operator/test_health.py, not users silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from runlease.operator.databases import Databases
from runlease.operator.k8s import Kubernetes

ORCHESTRATOR_TASK = "multidimensional multitasker"
WATCHER_TASK_PREFIX = "watcher for "
TIMEOUT_S = 2.0


class Health:
    def __init__(self, dbs: Databases, k8s: Kubernetes, namespace: str | None,
                 started: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
        self.dbs = dbs
        self.k8s = k8s
        self.namespace = namespace  # where to list pools; None: cluster-wide
        self.started = started
        self.timeout_s = timeout_s

    def live(self) -> tuple[bool, str]:
        names = [task.get_name() for task in asyncio.all_tasks()]  # the running ones
        if ORCHESTRATOR_TASK not in names:
            return False, "kopf's orchestrator is not running"
        watchers = sum(name.startswith(WATCHER_TASK_PREFIX) for name in names)
        if self.started() and watchers == 0:
            return False, "no kopf watch stream is running"
        return True, f"ok: {watchers} watch streams"

    async def ready(self) -> tuple[bool, str]:
        if not self.started():
            return False, "kopf is starting"
        try:
            await asyncio.wait_for(self.k8s.ping(self.namespace), self.timeout_s)
        except Exception as exc:  # any failure is "not ready", with its reason
            return False, f"Kubernetes API unreachable: {type(exc).__name__}: {exc}"
        failed = await self.dbs.unreachable(self.timeout_s)
        if failed:
            return False, f"database unreachable: {'; '.join(failed)}"
        return True, f"ok: {self.dbs.count} databases"
