"""The Kubernetes API calls the operator makes, through the `kubernetes` client.

Credentials load the client's way (in-cluster, else the kubeconfig named by
KUBECONFIG at call time), and kopf logs in from the same configuration
(`connection_info`). Every call goes through the client's AppsV1Api,
CoreV1Api, PolicyV1Api or CustomObjectsApi, which builds and quotes the
paths: no path is built here. The client is synchronous, so calls run in a
small thread pool of their own, each with a request timeout and an overall
one: the operator's event loop never blocks on the API server. Objects are
applied by merge PATCH, created when missing: never replaced.

API_CALLS lists every (verb, API group, resource) used here and by kopf; the
Helm chart's RBAC must cover each (a test compares them).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import kopf
import urllib3
from kubernetes import client as k
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel

from runlease.client.errors import ApiError
from runlease.operator.build import GROUP, VERSION, serialize

T = TypeVar("T")

MERGE_PATCH = "application/merge-patch+json"
PLURAL = "agentrunpools"
THREADS = 4  # calls in flight at once; more wait their turn
CONNECT_TIMEOUT_S = 5.0
TIMEOUT_S = 30.0

# The verbs used on each (API group, resource), as RBAC rules grant them:
# here, then by kopf itself.
_VERBS_OURS: dict[tuple[str, str], tuple[str, ...]] = {
    ("apps", "deployments"): ("get", "create", "patch"),
    ("", "services"): ("get", "create", "patch"),
    ("policy", "poddisruptionbudgets"): ("get", "create", "patch"),
    ("", "pods"): ("list", "patch"),
    ("", "secrets"): ("get",),
    ("runlease.dev", "agentrunpools"): ("get",),
    ("runlease.dev", "agentrunpools/status"): ("patch",),
}
# Watching pools and deployments, its finalizer and progress annotations,
# events, and peering between operator replicas: kopfpeerings when watching
# namespaces, clusterkopfpeerings with --all-namespaces (API_CALLS_CLUSTERWIDE
# swaps them).
_VERBS_KOPF: dict[tuple[str, str], tuple[str, ...]] = {
    ("runlease.dev", "agentrunpools"): ("list", "watch", "patch"),
    ("apps", "deployments"): ("list", "watch"),
    ("", "events"): ("create",),
    ("kopf.dev", "kopfpeerings"): ("get", "list", "watch", "patch"),
    ("apiextensions.k8s.io", "customresourcedefinitions"): ("list", "watch"),
}

API_CALLS: tuple[tuple[str, str, str], ...] = tuple(
    (verb, group, resource)
    for table in (_VERBS_OURS, _VERBS_KOPF)
    for (group, resource), verbs in table.items() for verb in verbs)

API_CALLS_CLUSTERWIDE: tuple[tuple[str, str, str], ...] = tuple(
    (verb, group, "clusterkopfpeerings" if resource == "kopfpeerings" else resource)
    for verb, group, resource in API_CALLS
)



def load_configuration() -> k.Configuration:
    """In-cluster credentials, else the kubeconfig: read now (the client's
    no-argument loader reads KUBECONFIG once, at import)."""
    configuration = k.Configuration()
    # kubernetes.config is not typed (its client is).
    try:
        kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration)
    except kube_config.ConfigException:
        kube_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG") or None,
            client_configuration=configuration)
    return configuration


def connection_info(configuration: k.Configuration) -> kopf.ConnectionInfo:
    """kopf's login, from the client's configuration: one source of credentials."""
    auth = configuration.get_api_key_with_prefix("BearerToken", alias="authorization") or ""
    scheme, _, token = auth.partition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert or None,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme or None if token else None,
        token=token or scheme or None,
        certificate_path=configuration.cert_file or None,
        private_key_path=configuration.key_file or None,
    )


class Kubernetes:
    def __init__(self, configuration: k.Configuration, *, timeout_s: float = TIMEOUT_S,
                 threads: int = THREADS) -> None:
        self.client = k.ApiClient(configuration)
        self.apps = k.AppsV1Api(self.client)
        self.core = k.CoreV1Api(self.client)
        self.policy = k.PolicyV1Api(self.client)
        self.custom = k.CustomObjectsApi(self.client)
        self.timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(max_workers=threads,
                                            thread_name_prefix="runlease-k8s")
        # What apply() calls per kind: (patch, create).
        self._appliers: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
            "Deployment": (self.apps.patch_namespaced_deployment,
                           self.apps.create_namespaced_deployment),
            "Service": (self.core.patch_namespaced_service,
                        self.core.create_namespaced_service),
            "PodDisruptionBudget": (self.policy.patch_namespaced_pod_disruption_budget,
                                    self.policy.create_namespaced_pod_disruption_budget),
        }

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.client.close()  # type: ignore[no-untyped-call]

    async def call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One client call in the thread pool; its errors as ApiError."""
        kwargs["_request_timeout"] = (CONNECT_TIMEOUT_S, self.timeout_s)
        loop = asyncio.get_running_loop()
        name = getattr(method, "__name__", "call")
        try:
            # The request timeout bounds the thread; this bounds the wait for
            # a free thread as well.
            return await asyncio.wait_for(
                loop.run_in_executor(self._executor, partial(method, *args, **kwargs)),
                CONNECT_TIMEOUT_S + self.timeout_s * 2)
        except ApiException as exc:
            body = exc.body.decode() if isinstance(exc.body, bytes) else str(exc.body or "")
            raise ApiError(exc.status or 0, "", f"{name}: {exc.reason}: {body[:300]}") from exc
        except (urllib3.exceptions.HTTPError, OSError, TimeoutError) as exc:
            raise ApiError(0, "", f"{name}: {type(exc).__name__}: {exc}") from exc

    async def _read(self, method: Callable[..., Any], *args: Any) -> Any:
        """A read; None when the object does not exist."""
        try:
            return await self.call(method, *args)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def apply(self, obj: BaseModel) -> None:
        """Merge-PATCH the object; create it when missing (PATCH again if a
        concurrent handler created it first)."""
        kind, meta = getattr(obj, "kind", None), getattr(obj, "metadata", None)
        if kind not in self._appliers or meta is None:
            raise ValueError(f"cannot apply a {type(obj).__name__}")
        patch, create = self._appliers[kind]
        for attempt in range(3):
            try:
                await self.call(patch, meta.name, meta.namespace, obj, _content_type=MERGE_PATCH)
                return
            except ApiError as exc:
                if exc.status != 404 or attempt == 2:
                    raise
            try:
                await self.call(create, meta.namespace, obj)
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
        raise AssertionError("unreachable")

    async def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = await self._read(self.apps.read_namespaced_deployment, name, namespace)
        return None if found is None else dict(serialize(found))

    async def pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        found = await self.call(self.core.list_namespaced_pod, namespace,
                                label_selector=",".join(f"{k}={v}" for k, v in selector.items()))
        items: list[dict[str, Any]] = [serialize(p) for p in found.items or []]
        # Filter here too: a label selector is a request, not every server honours it.
        return [p for p in items
                if all(p.get("metadata", {}).get("labels", {}).get(key) == value
                       for key, value in selector.items())]

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        await self.call(self.core.patch_namespaced_pod, name, namespace,
                        {"metadata": {"annotations": annotations}}, _content_type=MERGE_PATCH)

    async def secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's data (base64 values); None when there is no such Secret."""
        found = await self._read(self.core.read_namespaced_secret, name, namespace)
        return None if found is None else dict(found.data or {})

    async def pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = await self._read(self.custom.get_namespaced_custom_object,
                                 GROUP, VERSION, namespace, PLURAL, name)
        return None if found is None else dict(found)

    async def ping(self, namespace: str | None) -> None:
        """One cheap call the operator's RBAC allows: list at most one pool."""
        if namespace:
            await self.call(self.custom.list_namespaced_custom_object,
                            GROUP, VERSION, namespace, PLURAL, limit=1)
        else:
            await self.call(self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                            limit=1)
