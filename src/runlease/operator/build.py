"""Pure builders: a PoolSpec in, Kubernetes objects out. No I/O; the
handlers apply what these return, and tests check every field.

Objects are the `kubernetes` client's typed models, so a misspelt field is
an error where it is built, not a field the API server drops; `serialize`
turns one into the JSON the client sends. The `build_*` functions return
that JSON (tests/operator/golden/ holds what the builders made as plain
dicts before, and a test keeps them equal).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from kubernetes import client as k
from pydantic import BaseModel

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
RUNTIME_DEFAULT = "RuntimeDefault"


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


@cache
def _serializer() -> k.ApiClient:
    # Only its serialisation is used: it never makes a request.
    return k.ApiClient()


def serialize(obj: Any) -> Any:
    """A typed object (or a list or dict of them) as the JSON the client sends."""
    return _serializer().sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]


def owner_reference(owner: dict[str, Any]) -> k.V1OwnerReference:
    meta = owner["metadata"]
    return k.V1OwnerReference(api_version=f"{GROUP}/{VERSION}", kind=KIND, name=meta["name"],
                              uid=meta["uid"], controller=True, block_owner_deletion=True)


def _metadata(spec: PoolSpec, part: str, owner: dict[str, Any]) -> k.V1ObjectMeta:
    """The metadata of the pool's `part` (a key of names())."""
    return k.V1ObjectMeta(name=names(spec)[part], namespace=spec.namespace, labels=labels(spec),
                          owner_references=[owner_reference(owner)])


def worker_env(spec: PoolSpec) -> list[k.V1EnvVar]:
    def value(name: str, v: object) -> k.V1EnvVar:
        return k.V1EnvVar(name=name, value=str(v).lower() if isinstance(v, bool) else str(v))

    def field(name: str, path: str) -> k.V1EnvVar:
        return k.V1EnvVar(name=name, value_from=k.V1EnvVarSource(
            field_ref=k.V1ObjectFieldSelector(field_path=path)))

    return [
        field("POD_UID", "metadata.uid"),
        field("POD_NAME", "metadata.name"),
        k.V1EnvVar(name="RUNLEASE_DATABASE_URL", value_from=k.V1EnvVarSource(
            secret_key_ref=k.V1SecretKeySelector(name=spec.database_secret,
                                                 key=spec.database_key))),
        *database_extras(spec),
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
        *sandbox_env(spec),
        *(k.V1EnvVar.model_validate(e) for e in spec.env),
    ]


def sandbox_env(spec: PoolSpec) -> list[k.V1EnvVar]:
    """spec.toolSandbox as the worker's settings (worker/sandbox.py)."""
    box = spec.tool_sandbox
    out = {"RUNLEASE_TOOL_SANDBOX": str(box.enabled).lower(),
           "RUNLEASE_TOOL_NETWORK": str(box.network).lower()}
    for name in ("max_processes", "memory_mib", "cpu_s", "file_size_mib", "disk_mib"):
        if (limit := getattr(box, name)) is not None:
            out[f"RUNLEASE_TOOL_{name.upper()}"] = str(limit)
    if box.hide_paths:
        out["RUNLEASE_TOOL_HIDE_PATHS"] = ",".join(box.hide_paths)
    if not box.enabled:
        if box.tenant:
            out["RUNLEASE_TOOL_TENANT"] = box.tenant
        else:  # the operator let it through: its admin listed the pool (spec.check_sandbox)
            out["RUNLEASE_UNSANDBOXED_POOL"] = spec.pool
    return [k.V1EnvVar(name=name, value=v) for name, v in out.items()]


def database_extras(spec: PoolSpec) -> list[k.V1EnvVar]:
    """Behind PgBouncer in transaction mode: LISTEN on the direct URL's Secret,
    prepared statements off. Nothing when the spec leaves both at their defaults."""
    extras = []
    if spec.listen_secret is not None:
        extras.append(k.V1EnvVar(name="RUNLEASE_LISTEN_DATABASE_URL", value_from=k.V1EnvVarSource(
            secret_key_ref=k.V1SecretKeySelector(name=spec.listen_secret, key=spec.listen_key))))
    if not spec.prepared_statements:
        extras.append(k.V1EnvVar(name="RUNLEASE_PREPARED_STATEMENTS", value="false"))
    return extras


def worker_security_context(spec: PoolSpec | None = None) -> k.V1SecurityContext:
    """A worker runs tools a model chose: the container gives them nothing to
    escalate with and nowhere to write but its two emptyDirs. With the tool
    sandbox, bwrap must make user namespaces and mount a fresh /proc: the
    runtime's default seccomp profile refuses unshare(2) (the spec names
    another, Unconfined by default) and a masked /proc cannot be mounted
    again (Unmasked, which Kubernetes allows in a user-namespaced pod)."""
    sandboxed = spec is not None and spec.tool_sandbox.enabled
    seccomp = (k.V1SeccompProfile.model_validate(spec.tool_sandbox.seccomp_profile)
               if spec is not None and sandboxed else k.V1SeccompProfile(type=RUNTIME_DEFAULT))
    return k.V1SecurityContext(
        allow_privilege_escalation=False, run_as_non_root=True,
        read_only_root_filesystem=True, capabilities=k.V1Capabilities(drop=["ALL"]),
        seccomp_profile=seccomp, proc_mount="Unmasked" if sandboxed else None)


def _probe(path: str, period_s: int) -> k.V1Probe:
    return k.V1Probe(http_get=k.V1HTTPGetAction(path=path, port="metrics"),
                     period_seconds=period_s, timeout_seconds=3, failure_threshold=3)


def deployment(spec: PoolSpec, owner: dict[str, Any], replicas: int) -> k.V1Deployment:
    container = k.V1Container(
        name="worker",
        image=spec.image,
        image_pull_policy=spec.image_pull_policy,
        args=["worker"],
        env=worker_env(spec),
        ports=[k.V1ContainerPort(name="metrics", container_port=spec.metrics_port,
                                 protocol="TCP")],
        liveness_probe=_probe("/healthz", 10),
        readiness_probe=_probe("/readyz", 5),
        security_context=worker_security_context(spec),
        working_dir=WORK_DIR,
        volume_mounts=[k.V1VolumeMount(name="tmp", mount_path=TMP_DIR),
                       k.V1VolumeMount(name="work", mount_path=WORK_DIR)],
        resources=(k.V1ResourceRequirements.model_validate(spec.resources)
                   if spec.resources else None),
        env_from=[k.V1EnvFromSource.model_validate(e) for e in spec.env_from] or None,
    )
    pod = k.V1PodSpec(
        containers=[container],
        # The pod's pause process becomes PID 1 and reaps what a dead worker
        # leaves: its tools' guards (worker/toolguard.py), which end themselves.
        share_process_namespace=True,
        # The sandbox's /proc needs procMount Unmasked, allowed in a pod of
        # its own user namespace only; a safer pod either way.
        host_users=False if spec.tool_sandbox.enabled else None,
        security_context=k.V1PodSecurityContext(
            run_as_non_root=True, seccomp_profile=k.V1SeccompProfile(type=RUNTIME_DEFAULT)),
        # Nothing in a worker talks to the Kubernetes API; a tool must not either.
        automount_service_account_token=False,
        volumes=[k.V1Volume(name="tmp", empty_dir=k.V1EmptyDirVolumeSource()),
                 k.V1Volume(name="work", empty_dir=k.V1EmptyDirVolumeSource())],
        # Above the worker's drain grace: runs finish or are released before SIGKILL.
        termination_grace_period_seconds=spec.termination_grace_s,
        service_account_name=spec.service_account_name or None,
        node_selector=spec.node_selector or None,
        tolerations=[k.V1Toleration.model_validate(t) for t in spec.tolerations] or None,
        affinity=k.V1Affinity.model_validate(spec.affinity) if spec.affinity else None,
        image_pull_secrets=[k.V1LocalObjectReference(name=name)
                            for name in spec.image_pull_secrets] or None,
        priority_class_name=spec.priority_class_name,
        topology_spread_constraints=[
            k.V1TopologySpreadConstraint.model_validate(c)
            for c in spec.topology_spread_constraints] or None,
    )
    return k.V1Deployment(
        api_version="apps/v1", kind="Deployment", metadata=_metadata(spec, "deployment", owner),
        spec=k.V1DeploymentSpec(
            replicas=replicas,
            selector=k.V1LabelSelector(match_labels=selector(spec)),
            revision_history_limit=5,
            # Never below the wanted count while rolling: a rollout drains
            # old workers only once new ones are ready.
            strategy=k.V1DeploymentStrategy(
                type="RollingUpdate",
                rolling_update=k.V1RollingUpdateDeployment(max_unavailable=0, max_surge=1)),
            template=k.V1PodTemplateSpec(
                metadata=k.V1ObjectMeta(labels={**spec.pod_labels, **labels(spec)},
                                        annotations=dict(spec.pod_annotations) or None),
                spec=pod),
        ),
    )


def service(spec: PoolSpec, owner: dict[str, Any]) -> k.V1Service:
    return k.V1Service(
        api_version="v1", kind="Service", metadata=_metadata(spec, "service", owner),
        spec=k.V1ServiceSpec(
            type="ClusterIP",
            selector=selector(spec),
            ports=[k.V1ServicePort(name="metrics", port=spec.metrics_port,
                                   target_port="metrics", protocol="TCP")],
        ),
    )


def pdb(spec: PoolSpec, owner: dict[str, Any]) -> k.V1PodDisruptionBudget:
    return k.V1PodDisruptionBudget(
        api_version="policy/v1", kind="PodDisruptionBudget", metadata=_metadata(spec, "pdb", owner),
        spec=k.V1PodDisruptionBudgetSpec(
            # One worker at a time: an evicted worker drains and releases its
            # runs, so evictions are safe, but not all at once.
            max_unavailable=1,
            selector=k.V1LabelSelector(match_labels=selector(spec)),
        ),
    )


def objects(spec: PoolSpec, owner: dict[str, Any], replicas: int) -> list[BaseModel]:
    """What the operator applies for a pool, in order (the PDB last)."""
    return [deployment(spec, owner, replicas), service(spec, owner), pdb(spec, owner)]


def build_deployment(spec: PoolSpec, owner: dict[str, Any], replicas: int) -> dict[str, Any]:
    out: dict[str, Any] = serialize(deployment(spec, owner, replicas))
    return out


def build_service(spec: PoolSpec, owner: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = serialize(service(spec, owner))
    return out


def build_pdb(spec: PoolSpec, owner: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = serialize(pdb(spec, owner))
    return out


def build_all(spec: PoolSpec, owner: dict[str, Any], replicas: int) -> list[dict[str, Any]]:
    return [serialize(obj) for obj in objects(spec, owner, replicas)]
