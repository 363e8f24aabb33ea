"""Pure builders: a PoolSpec in, Kubernetes manifests out. No I/O; the
handlers apply what these return, and tests check every field."""

from __future__ import annotations

from typing import Any

from runlease.operator.spec import PoolSpec

GROUP = "runlease.dev"
VERSION = "v1alpha1"
KIND = "AgentRunPool"
POOL_LABEL = "runlease.dev/pool"
OWNER_LABEL = "runlease.dev/agentrunpool"
COMPONENT = "worker"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# The only writable places of a worker pod (its root filesystem is read-only):
# /tmp, and the working directory its tools start in, which is also their HOME.
WORK_DIR = "/work"
TMP_DIR = "/tmp"
RUNTIME_DEFAULT = {"type": "RuntimeDefault"}


def names(spec: PoolSpec) -> dict[str, str]:
    return {"deployment": f"{spec.name}-workers", "service": f"{spec.name}-metrics",
            "pdb": f"{spec.name}-workers"}


def selector(spec: PoolSpec) -> dict[str, str]:
    return {OWNER_LABEL: spec.name, "app.kubernetes.io/component": COMPONENT}


def selector_string(spec: PoolSpec) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector(spec).items()))


def labels(spec: PoolSpec) -> dict[str, str]:
    return {
        **selector(spec),
        "app.kubernetes.io/name": "runlease",
        "app.kubernetes.io/managed-by": "runlease-operator",
        POOL_LABEL: spec.pool,
    }


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def _metadata(spec: PoolSpec, name: str, owner: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, "labels": labels(spec),
            "ownerReferences": [owner_reference(owner)]}


def worker_env(spec: PoolSpec) -> list[dict[str, Any]]:
    def value(name: str, v: object) -> dict[str, Any]:
        return {"name": name, "value": str(v).lower() if isinstance(v, bool) else str(v)}

    return [
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "RUNLEASE_DATABASE_URL", "valueFrom": {"secretKeyRef": {
            "name": spec.database_secret, "key": spec.database_key}}},
        value("RUNLEASE_POOL", spec.pool),
        value("RUNLEASE_AGENT", spec.agent),
        value("RUNLEASE_CONCURRENCY", spec.concurrency_per_worker),
        value("RUNLEASE_HEARTBEAT_INTERVAL_S", spec.heartbeat_s),
        value("RUNLEASE_DRAIN_GRACE_S", spec.drain_grace_s),
        value("RUNLEASE_METRICS_PORT", spec.metrics_port),
        value("RUNLEASE_LOG_JSON", True),
        # Tools inherit these (docs/agents.md): they are the pod's writable places.
        value("HOME", WORK_DIR),
        value("TMPDIR", TMP_DIR),
        *spec.env,
    ]


def worker_security_context() -> dict[str, Any]:
    """A worker runs tools a model chose: the container gives them nothing to
    escalate with and nowhere to write but its two emptyDirs."""
    return {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": RUNTIME_DEFAULT}


def build_deployment(spec: PoolSpec, owner: dict[str, Any], replicas: int) -> dict[str, Any]:
    probe = {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 10,
             "timeoutSeconds": 3, "failureThreshold": 3}
    container: dict[str, Any] = {
        "name": "worker",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": ["worker"],
        "env": worker_env(spec),
        "ports": [{"name": "metrics", "containerPort": spec.metrics_port, "protocol": "TCP"}],
        "livenessProbe": probe,
        "readinessProbe": {**probe, "httpGet": {"path": "/readyz", "port": "metrics"},
                           "periodSeconds": 5},
        "securityContext": worker_security_context(),
        "workingDir": WORK_DIR,
        "volumeMounts": [{"name": "tmp", "mountPath": TMP_DIR},
                         {"name": "work", "mountPath": WORK_DIR}],
    }
    if spec.resources:
        container["resources"] = spec.resources
    pod: dict[str, Any] = {
        "containers": [container],
        # The pod's pause process becomes PID 1 and reaps what a dead worker
        # leaves: its tools' guards (worker/toolguard.py), which end themselves.
        "shareProcessNamespace": True,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": RUNTIME_DEFAULT},
        # Nothing in a worker talks to the Kubernetes API; a tool must not either.
        "automountServiceAccountToken": False,
        "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "work", "emptyDir": {}}],
        # Above the worker's drain grace: runs finish or are released before SIGKILL.
        "terminationGracePeriodSeconds": spec.termination_grace_s,
    }
    for key, value in (("serviceAccountName", spec.service_account_name),
                       ("nodeSelector", spec.node_selector), ("tolerations", spec.tolerations),
                       ("affinity", spec.affinity)):
        if value:
            pod[key] = value
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    template_meta: dict[str, Any] = {"labels": {**spec.pod_labels, **labels(spec)}}
    if spec.pod_annotations:
        template_meta["annotations"] = dict(spec.pod_annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(spec, names(spec)["deployment"], owner),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(spec)},
            "revisionHistoryLimit": 5,
            # Never below the wanted count while rolling: a rollout drains
            # old workers only once new ones are ready.
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": template_meta, "spec": pod},
        },
    }


def build_service(spec: PoolSpec, owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, names(spec)["service"], owner),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(spec),
            "ports": [{"name": "metrics", "port": spec.metrics_port, "targetPort": "metrics",
                       "protocol": "TCP"}],
        },
    }


def build_pdb(spec: PoolSpec, owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(spec, names(spec)["pdb"], owner),
        "spec": {
            # One worker at a time: an evicted worker drains and releases its
            # runs, so evictions are safe, but not all at once.
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector(spec)},
        },
    }


def build_all(spec: PoolSpec, owner: dict[str, Any], replicas: int) -> list[dict[str, Any]]:
    return [build_deployment(spec, owner, replicas), build_service(spec, owner),
            build_pdb(spec, owner)]
