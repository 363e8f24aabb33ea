"""The few Kubernetes API calls the operator makes, over kopf's credentials.

Plain aiohttp (which kopf itself uses) with the server, TLS and headers of
kopf's ConnectionInfo: async, no extra dependency, and the Content-Type of
every PATCH is ours to choose. Objects are applied by merge PATCH, created
by POST when missing: never replaced.

API_CALLS lists every (verb, API group, resource) used here; the Helm chart's
RBAC must cover each (a test compares them).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf

MERGE_PATCH = "application/merge-patch+json"

API_CALLS: tuple[tuple[str, str, str], ...] = (
    ("get", "apps", "deployments"),
    ("create", "apps", "deployments"),
    ("patch", "apps", "deployments"),
    ("get", "", "services"),
    ("create", "", "services"),
    ("patch", "", "services"),
    ("get", "policy", "poddisruptionbudgets"),
    ("create", "policy", "poddisruptionbudgets"),
    ("patch", "policy", "poddisruptionbudgets"),
    ("list", "", "pods"),
    ("patch", "", "pods"),
    ("get", "", "secrets"),
    ("get", "runlease.dev", "agentrunpools"),
    ("patch", "runlease.dev", "agentrunpools/status"),
    # kopf's own: watching pools and deployments, its finalizer and progress
    # annotations, events, and peering between operator replicas.
    ("list", "runlease.dev", "agentrunpools"),
    ("watch", "runlease.dev", "agentrunpools"),
    ("patch", "runlease.dev", "agentrunpools"),
    ("list", "apps", "deployments"),
    ("watch", "apps", "deployments"),
    ("create", "", "events"),
    # Peering: kopfpeerings when watching namespaces, clusterkopfpeerings
    # with --all-namespaces (API_CALLS_CLUSTERWIDE swaps them).
    ("get", "kopf.dev", "kopfpeerings"),
    ("list", "kopf.dev", "kopfpeerings"),
    ("watch", "kopf.dev", "kopfpeerings"),
    ("patch", "kopf.dev", "kopfpeerings"),
    ("list", "apiextensions.k8s.io", "customresourcedefinitions"),
    ("watch", "apiextensions.k8s.io", "customresourcedefinitions"),
)

API_CALLS_CLUSTERWIDE: tuple[tuple[str, str, str], ...] = tuple(
    (verb, group, "clusterkopfpeerings" if resource == "kopfpeerings" else resource)
    for verb, group, resource in API_CALLS
)

PATHS = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Service": "/api/v1/namespaces/{ns}/services",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
}


def segment(name: str) -> str:
    """One path segment: a name is quoted whole, so '/' or '..' in it can
    never reach another path (spec.parse refuses such names first)."""
    return quote(name, safe="")


def secret_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{segment(namespace)}/secrets/{segment(name)}"


def pool_path(namespace: str, name: str) -> str:
    return (f"/apis/runlease.dev/v1alpha1/namespaces/{segment(namespace)}/agentrunpools/"
            f"{segment(name)}")


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Kubernetes:
    def __init__(self, info: kopf.ConnectionInfo) -> None:
        self.base = info.server.rstrip("/")
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=info.as_ssl_context()),
            headers=info.as_http_headers(), timeout=aiohttp.ClientTimeout(total=30))

    async def close(self) -> None:
        await self.session.close()

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = "application/json",
                      params: dict[str, str] | None = None) -> Any:
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.base + path, data=data, params=params,
                                        headers={"Content-Type": content_type}) as response:
            text = await response.text()
            if response.status >= 400:
                raise ApiError(response.status, f"{method} {path}: {text[:300]}")
            return json.loads(text) if text else None

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Merge-PATCH the object; POST it when missing (PATCH again if a
        concurrent handler created it first)."""
        meta = manifest["metadata"]
        collection = PATHS[manifest["kind"]].format(ns=segment(meta["namespace"]))
        item = f"{collection}/{segment(meta['name'])}"
        for attempt in range(3):
            try:
                result: dict[str, Any] = await self.request("PATCH", item, manifest, MERGE_PATCH)
                return result
            except ApiError as exc:
                if exc.status != 404 or attempt == 2:
                    raise
            try:
                created: dict[str, Any] = await self.request("POST", collection, manifest)
                return created
            except ApiError as exc:
                if exc.status != 409:
                    raise
        raise AssertionError("unreachable")

    async def pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        found = await self.request(
            "GET", f"/api/v1/namespaces/{segment(namespace)}/pods",
            params={"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())})
        items = (found or {}).get("items", [])
        # Filter here too: a label selector is a request, not every server honours it.
        return [p for p in items
                if all(p.get("metadata", {}).get("labels", {}).get(k) == v
                       for k, v in selector.items())]

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        await self.request("PATCH", f"/api/v1/namespaces/{segment(namespace)}/pods/{segment(name)}",
                           {"metadata": {"annotations": annotations}}, MERGE_PATCH)

    async def ping(self, namespace: str | None) -> None:
        """One cheap call the operator's RBAC allows: list at most one pool."""
        path = (f"/apis/runlease.dev/v1alpha1/namespaces/{segment(namespace)}/agentrunpools"
                if namespace else "/apis/runlease.dev/v1alpha1/agentrunpools")
        await self.request("GET", path, params={"limit": "1"})

    async def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.get(f"{PATHS['Deployment'].format(ns=segment(namespace))}/"
                              f"{segment(name)}")
