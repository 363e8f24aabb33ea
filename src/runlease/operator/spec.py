"""An AgentRunPool's spec, read and checked: the operator's one view of it.

The CRD's schema and CEL rules reject most bad specs at the API server; this
checks them again (an older API server may not run CEL, and KMock runs
nothing) and fills the defaults, so builders get a complete, typed spec.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from kubernetes import client as k
from pydantic import BaseModel
from pydantic import ValidationError as ModelError

from runlease.core import bounds
from runlease.db.keys import KeyLimits, check_key_limit_name, checked_key_limits
from runlease.db.models import DEFAULT_RETENTION_S, TenantLimit
from runlease.errors import ValidationError
from runlease.operator import names

T = TypeVar("T")

AGENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
MAX_NAME_CHARS = 50


class InvalidSpec(ValueError):
    """The spec cannot be acted on; the message says which field and why."""


@dataclass(frozen=True)
class ToolSandboxSpec:
    """spec.toolSandbox: how the pool's workers sandbox tools (worker/sandbox.py).
    None in a limit: the worker's default."""

    enabled: bool = True
    network: bool = True
    max_processes: int | None = None
    memory_mib: int | None = None
    cpu_s: int | None = None
    file_size_mib: int | None = None
    disk_mib: int | None = None
    hide_paths: tuple[str, ...] = ()
    # Unsandboxed: the one tenant whose tools run (other tenants' tool calls fail).
    tenant: str | None = None
    # The worker container's seccomp profile when sandboxed: the runtime's
    # default refuses unshare(2), which bwrap needs.
    seccomp_profile: dict[str, Any] = field(
        default_factory=lambda: {"type": "Unconfined"})


SANDBOX_LIMITS = {  # spec key: (field, minimum, maximum), as WorkerSettings bounds them
    "maxProcesses": ("max_processes", 8, 1_000_000),
    "memoryMiB": ("memory_mib", 64, 1_048_576),
    "cpuSeconds": ("cpu_s", 1, 1_000_000),
    "fileSizeMiB": ("file_size_mib", 1, 1_048_576),
    "diskMiB": ("disk_mib", 1, 1_048_576),
}
HIDE_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]{0,254}$")
MAX_HIDE_PATHS = 32


@dataclass(frozen=True)
class PoolSpec:
    name: str
    namespace: str
    pool: str
    image: str
    agent: str
    database_secret: str
    database_key: str = "url"
    # Behind PgBouncer in transaction mode: the LISTEN session's direct URL
    # (a Secret and key), and prepared statements off.
    listen_secret: str | None = None
    listen_key: str = "url"
    prepared_statements: bool = True
    image_pull_policy: str = "IfNotPresent"
    concurrency_per_worker: int = 10
    replicas_min: int = 1
    replicas_max: int = 10
    autoscaling: bool = True
    target_runs_per_worker: float = 1.0
    scale_down_delay_s: int = 300
    lease_s: int = 45
    heartbeat_s: float = 15.0
    max_attempts: int = 3
    priority_aging_s: int = 60
    default_max_in_flight: int | None = None
    tenant_overrides: dict[str, TenantLimit] = field(default_factory=dict)
    # Limits per concurrency key (issue 27): spec.concurrencyKeys.
    key_limits: KeyLimits = field(default_factory=KeyLimits)
    retention_s: int = DEFAULT_RETENTION_S
    paused: bool = False
    tool_env: tuple[str, ...] = ()
    tool_sandbox: ToolSandboxSpec = field(default_factory=ToolSandboxSpec)
    drain_grace_s: int = 25
    termination_grace_s: int = 60
    metrics_port: int = 9464
    resources: dict[str, Any] = field(default_factory=dict)
    env: list[dict[str, Any]] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)
    service_account_name: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    priority_class_name: str | None = None
    topology_spread_constraints: list[dict[str, Any]] = field(default_factory=list)
    env_from: list[dict[str, Any]] = field(default_factory=list)
    pod_annotations: dict[str, str] = field(default_factory=dict)
    pod_labels: dict[str, str] = field(default_factory=dict)


def _lookup(spec: Mapping[str, Any], path: str) -> Any:
    value: Any = spec
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _int(spec: Mapping[str, Any], path: str, default: int, lo: int, hi: int) -> int:
    value = _lookup(spec, path)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidSpec(f"spec.{path} must be an integer from {lo} to {hi}, got {value!r}")
    return value


def _num(spec: Mapping[str, Any], path: str, default: float, lo: float, hi: float) -> float:
    value = _lookup(spec, path)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise InvalidSpec(f"spec.{path} must be a number from {lo} to {hi}, got {value!r}")
    return float(value)


def _mapping(spec: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = spec.get(key) or {}
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"spec.{key} must be an object")
    return dict(value)


def _list(spec: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    value = spec.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise InvalidSpec(f"spec.{key} must be a list of objects")
    return [dict(v) for v in value]


def _strings(spec: Mapping[str, Any], key: str) -> dict[str, str]:
    value = _mapping(spec, key)
    if not all(isinstance(v, str) for v in value.values()):
        raise InvalidSpec(f"spec.{key} values must be strings")
    return value


def parse(name: str, namespace: str, spec: Mapping[str, Any]) -> PoolSpec:
    """The spec of AgentRunPool `name`, checked, defaults filled."""
    # Its name becomes label values (at most 63) and "<name>-metrics".
    _named("metadata.name", partial(names.label, max_chars=MAX_NAME_CHARS), name)
    image = spec.get("image")
    if not isinstance(image, str) or not image:
        raise InvalidSpec("spec.image is required")
    agent = spec.get("agent")
    if not isinstance(agent, str) or not AGENT_RE.match(agent):
        raise InvalidSpec(f"spec.agent must look like module:callable, got {agent!r}")
    pool = _bounded("spec.pool" if spec.get("pool") else "metadata.name (the default pool name)",
                    bounds.check_pool, spec.get("pool") or name)
    secret = _mapping(_mapping(spec, "database"), "secretKeyRef")
    if secret.get("name") is None:
        raise InvalidSpec("spec.database.secretKeyRef.name is required")
    # The operator reads this Secret itself: a name that is not a name could
    # point its request elsewhere.
    secret_name = _named("spec.database.secretKeyRef.name", names.subdomain, secret["name"])
    secret_key = _named("spec.database.secretKeyRef.key", names.secret_key,
                        secret.get("key", "url"))
    listen_secret, listen_key = _listen_secret(_mapping(spec, "database"))
    policy = spec.get("imagePullPolicy", "IfNotPresent")
    if policy not in PULL_POLICIES:
        raise InvalidSpec(f"spec.imagePullPolicy must be one of {', '.join(PULL_POLICIES)}")
    default_limit = _optional_int(spec, "tenants.defaultMaxInFlight")
    if default_limit is None:
        default_limit = default_share(
            _int(spec, "tenants.defaultSharePercent", DEFAULT_SHARE_PERCENT, 1, 100),
            _int(spec, "replicas.max", 10, 1, 1000), _int(spec, "concurrencyPerWorker", 10, 1,
                                                          1000))
    parsed = PoolSpec(
        name=name, namespace=namespace, pool=pool, image=image, agent=agent,
        database_secret=secret_name, database_key=secret_key,
        listen_secret=listen_secret, listen_key=listen_key,
        prepared_statements=_bool(_mapping(spec, "database"), "preparedStatements",
                                  default=True, where="spec.database"),
        image_pull_policy=policy,
        concurrency_per_worker=_int(spec, "concurrencyPerWorker", 10, 1, 1000),
        replicas_min=_int(spec, "replicas.min", 1, 0, 1000),
        replicas_max=_int(spec, "replicas.max", 10, 1, 1000),
        autoscaling=bool(_mapping(spec, "autoscaling").get("enabled", True)),
        target_runs_per_worker=_num(spec, "autoscaling.targetRunsPerWorker", 1.0, 0.01, 1.0),
        scale_down_delay_s=_int(spec, "autoscaling.scaleDownDelaySeconds", 300, 0, 86_400),
        lease_s=_int(spec, "lease.durationSeconds", 45, 2, 3600),
        heartbeat_s=_num(spec, "lease.heartbeatSeconds", 15.0, 0.1, 1800),
        max_attempts=_int(spec, "maxAttempts", 3, 1, 100),
        priority_aging_s=_int(spec, "priorityAgingSeconds", 60, 0, bounds.AGING_S_MAX),
        default_max_in_flight=default_limit,
        tenant_overrides=_overrides(spec),
        key_limits=_key_limits(spec),
        retention_s=_int(spec, "retentionSeconds", DEFAULT_RETENTION_S, 0,
                         bounds.RETENTION_S_MAX),
        paused=_bool(spec, "paused"),
        tool_env=_bounded("spec.toolEnv", bounds.check_tool_env, spec.get("toolEnv") or []),
        tool_sandbox=_tool_sandbox(spec),
        drain_grace_s=_int(spec, "drainGraceSeconds", 25, 0, 3600),
        termination_grace_s=_int(spec, "terminationGracePeriodSeconds", 60, 1, 7200),
        metrics_port=_int(spec, "metricsPort", 9464, 1, 65535),
        resources=_mapping(spec, "resources"),
        env=_list(spec, "env"),
        node_selector=_strings(spec, "nodeSelector"),
        tolerations=_list(spec, "tolerations"),
        affinity=_mapping(spec, "affinity"),
        service_account_name=_optional_name(spec, "serviceAccountName"),
        image_pull_secrets=_pull_secrets(spec),
        priority_class_name=_optional_name(spec, "priorityClassName"),
        topology_spread_constraints=_list(spec, "topologySpreadConstraints"),
        env_from=_list(spec, "envFrom"),
        pod_annotations=_strings(spec, "podAnnotations"),
        pod_labels=_strings(spec, "podLabels"),
    )
    _check_relations(parsed)
    _check_models(parsed)
    return parsed


def _typed(where: str, model: type[BaseModel], value: object) -> None:
    try:
        model.model_validate(value)
    except ModelError as exc:
        first = exc.errors()[0]
        at = ".".join(str(part) for part in first["loc"])
        raise InvalidSpec(f"{where}{'.' + at if at else ''}: {first['msg']}") from None


def _check_models(parsed: PoolSpec) -> None:
    """What passes through to the worker pod is checked against the
    Kubernetes types now: a misspelt field is an invalid spec, not a field
    the API server drops (or a Deployment it refuses) later."""
    for i, env in enumerate(parsed.env):
        _typed(f"spec.env[{i}]", k.V1EnvVar, env)
    for i, source in enumerate(parsed.env_from):
        _typed(f"spec.envFrom[{i}]", k.V1EnvFromSource, source)
    for i, constraint in enumerate(parsed.topology_spread_constraints):
        _typed(f"spec.topologySpreadConstraints[{i}]", k.V1TopologySpreadConstraint,
               constraint)
    for i, toleration in enumerate(parsed.tolerations):
        _typed(f"spec.tolerations[{i}]", k.V1Toleration, toleration)
    if parsed.affinity:
        _typed("spec.affinity", k.V1Affinity, parsed.affinity)
    if parsed.resources:
        _typed("spec.resources", k.V1ResourceRequirements, parsed.resources)
    _typed("spec.toolSandbox.seccompProfile", k.V1SeccompProfile,
           parsed.tool_sandbox.seccomp_profile)


def _tool_sandbox(spec: Mapping[str, Any]) -> ToolSandboxSpec:
    box = _mapping(spec, "toolSandbox")
    where = "spec.toolSandbox"
    limits = {name: _int(spec, f"toolSandbox.{key}", 0, lo, hi)
              if box.get(key) is not None else None
              for key, (name, lo, hi) in SANDBOX_LIMITS.items()}
    paths = box.get("hidePaths") or []
    if not isinstance(paths, list) or len(paths) > MAX_HIDE_PATHS or not all(
            isinstance(p, str) and HIDE_PATH_RE.match(p) and ".." not in p.split("/")
            for p in paths):
        raise InvalidSpec(f"{where}.hidePaths must be at most {MAX_HIDE_PATHS} absolute "
                          "paths (letters, digits, . _ - /; no ..)")
    tenant = box.get("tenant")
    if tenant is not None:
        tenant = _bounded(f"{where}.tenant", bounds.check_tenant, tenant)
    seccomp = _mapping(box, "seccompProfile") or {"type": "Unconfined"}
    return ToolSandboxSpec(
        enabled=_bool(box, "enabled", default=True, where=where),
        network=_bool(box, "network", default=True, where=where),
        hide_paths=tuple(paths), tenant=tenant, seccomp_profile=seccomp,
        **limits)


def check_sandbox(spec: PoolSpec, unsandboxed_pools: tuple[str, ...]) -> None:
    """A pool without a sandbox serves one tenant (spec.toolSandbox.tenant),
    unless the operator's admin named it (--unsandboxed-pools namespace/name):
    its tenants' tools would share the worker, files, processes and all."""
    box = spec.tool_sandbox
    if box.enabled or box.tenant or f"{spec.namespace}/{spec.name}" in unsandboxed_pools:
        return
    raise InvalidSpec(
        "spec.toolSandbox.enabled is false: tools of different tenants would share the "
        "workers; set spec.toolSandbox.tenant to the one tenant this pool serves, or ask "
        f"the operator's admin to list {spec.namespace}/{spec.name} in --unsandboxed-pools")


def _overrides(spec: Mapping[str, Any]) -> dict[str, TenantLimit]:
    # Checked by the same bounds the store applies: a value the store would
    # refuse is an invalid spec, not a write to retry forever.
    overrides: dict[str, TenantLimit] = {}
    for item in _list(_mapping(spec, "tenants"), "overrides"):
        tenant = _bounded("spec.tenants.overrides[].tenant", bounds.check_tenant,
                          item.get("tenant"))
        if tenant in overrides:
            raise InvalidSpec(f"spec.tenants.overrides names tenant {tenant!r} twice")
        where = f"spec.tenants.overrides[{tenant}]"
        limit = item.get("maxInFlight")
        if limit is not None:
            limit = _bounded(f"{where}.maxInFlight",
                             partial(bounds.check_max_in_flight, "maxInFlight"), limit)
        submits, tokens = item.get("submitsPerMinute"), item.get("tokensPerMinute")
        try:
            lo, hi = bounds.check_priority_band(item.get("priorityMin"), item.get("priorityMax"))
            bounds.check_rates(submits, tokens)
        except ValidationError as exc:
            field_name = {"submits_per_minute": "submitsPerMinute",
                          "tokens_per_minute": "tokensPerMinute"}.get(exc.field, exc.field)
            raise InvalidSpec(f"{where}.{field_name}: {exc.message}") from None
        # The spec is the whole truth of an operator's pool: rates it leaves
        # out are none (as caps and bands), never kept from an API call.
        overrides[tenant] = TenantLimit(limit, lo, hi, submits, tokens)
    return overrides


def _key_limits(spec: Mapping[str, Any]) -> KeyLimits:
    # The store's own checks: a value it would refuse is an invalid spec.
    keys = _mapping(spec, "concurrencyKeys")
    default = keys.get("defaultLimit")
    named: dict[str, Any] = {}  # limits checked below
    for item in _list(keys, "limits"):
        key = _bounded("spec.concurrencyKeys.limits[].key", check_key_limit_name,
                       item.get("key"))
        if key in named:
            raise InvalidSpec(f"spec.concurrencyKeys.limits names key {key!r} twice")
        named[key] = item.get("maxInFlight")
    try:
        return checked_key_limits(KeyLimits(default, named))
    except ValidationError as exc:
        raise InvalidSpec(f"spec.concurrencyKeys: {exc}") from None


def _listen_secret(database: Mapping[str, Any]) -> tuple[str | None, str]:
    ref = database.get("listenSecretKeyRef")
    if ref is None:
        return None, "url"
    if not isinstance(ref, Mapping) or ref.get("name") is None:
        raise InvalidSpec("spec.database.listenSecretKeyRef.name is required")
    return (_named("spec.database.listenSecretKeyRef.name", names.subdomain, ref["name"]),
            _named("spec.database.listenSecretKeyRef.key", names.secret_key,
                   ref.get("key", "url")))


def _named(where: str, check: Callable[[object], str], value: object) -> str:
    try:
        return check(value)
    except names.InvalidName as exc:
        raise InvalidSpec(f"{where} {exc}") from None


def _optional_name(spec: Mapping[str, Any], key: str) -> str | None:
    value = spec.get(key)
    return None if value is None else _named(f"spec.{key}", names.subdomain, value)


def _pull_secrets(spec: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(_named(f"spec.imagePullSecrets[{i}].name", names.subdomain, item.get("name"))
                 for i, item in enumerate(_list(spec, "imagePullSecrets")))


def _bool(spec: Mapping[str, Any], key: str, *, default: bool = False,
          where: str = "spec") -> bool:
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise InvalidSpec(f"{where}.{key} must be true or false, got {value!r}")
    return value


def _bounded(where: str, check: Callable[[object], T], value: object) -> T:
    try:
        return check(value)
    except ValidationError as exc:
        raise InvalidSpec(f"{where}: {exc.message}") from None


# A tenant's share of a pool's slots when the spec sets no default cap
# (issue 32: with none, one tenant held every slot and another waited 27 s).
DEFAULT_SHARE_PERCENT = 50


def default_share(percent: int, replicas_max: int, concurrency: int) -> int | None:
    """Each tenant's default cap on runs leased at once: `percent` of the
    pool's slots at its most replicas (under a flood the autoscaler gets
    there; 100: no cap), at least 1."""
    if percent >= 100:
        return None
    return max(1, -(-percent * replicas_max * concurrency // 100))


def _optional_int(spec: Mapping[str, Any], path: str) -> int | None:
    if _lookup(spec, path) is None:
        return None
    return _int(spec, path, 0, 0, bounds.MAX_IN_FLIGHT_MAX)


def _check_relations(parsed: PoolSpec) -> None:
    if parsed.replicas_min > parsed.replicas_max:
        raise InvalidSpec("spec.replicas.min must not exceed spec.replicas.max")
    if parsed.heartbeat_s * 2 >= parsed.lease_s:
        raise InvalidSpec("spec.lease.heartbeatSeconds must be below half of "
                          "spec.lease.durationSeconds")
    if parsed.termination_grace_s <= parsed.drain_grace_s + 5:
        raise InvalidSpec("spec.terminationGracePeriodSeconds must exceed "
                          "spec.drainGraceSeconds by more than 5")
