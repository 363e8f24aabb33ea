"""The pure builders: every spec field reaches the manifests, and every
manifest is valid Kubernetes (strict, for the oldest version we support)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from runlease.db.models import TenantLimit
from runlease.operator.autoscale import decide, wanted
from runlease.operator.build import (
    build_all,
    build_deployment,
    build_pdb,
    build_service,
    serialize,
)
from runlease.operator.spec import InvalidSpec, parse
from tests.operator.hostile import HOSTILE_NAMES

OLDEST_KUBERNETES = "1.27"  # docs/installation.md says so too
OWNER = {"metadata": {"name": "batch", "uid": "uid-batch"}}

FULL = {
    "image": "ghcr.io/acme/agents:1.2",
    "imagePullPolicy": "Always",
    "agent": "acme.agents:main",
    "pool": "batch-pool",
    "database": {"secretKeyRef": {"name": "pg", "key": "dsn"},
                 "listenSecretKeyRef": {"name": "pg-direct", "key": "dsn"},
                 "preparedStatements": False},
    "concurrencyPerWorker": 7,
    "replicas": {"min": 2, "max": 9},
    "autoscaling": {"enabled": True, "targetRunsPerWorker": 0.5, "scaleDownDelaySeconds": 120},
    "lease": {"durationSeconds": 30, "heartbeatSeconds": 10},
    "maxAttempts": 4,
    "priorityAgingSeconds": 30,
    "tenants": {"defaultMaxInFlight": 3, "overrides": [{"tenant": "vip", "maxInFlight": 9}]},
    "drainGraceSeconds": 20,
    "terminationGracePeriodSeconds": 45,
    "metricsPort": 9100,
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    "env": [{"name": "OPENAI_BASE_URL", "value": "http://llm:8000/v1"}],
    "nodeSelector": {"pool": "agents"},
    "tolerations": [{"key": "agents", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    "serviceAccountName": "agents",
    "imagePullSecrets": [{"name": "registry"}, {"name": "mirror.example"}],
    "podAnnotations": {"example.com/team": "ml"},
    "podLabels": {"team": "ml"},
}


# Only what the CRD requires.
MINIMAL = {"image": FULL["image"], "agent": FULL["agent"],
           "database": {"secretKeyRef": {"name": "pg", "key": "dsn"}}}


def test_a_direct_database_spec_adds_no_pgbouncer_env() -> None:
    env = env_of(build_deployment(parse("batch", "ml", MINIMAL), OWNER, replicas=1))
    assert "RUNLEASE_LISTEN_DATABASE_URL" not in env
    assert "RUNLEASE_PREPARED_STATEMENTS" not in env
    assert env["RUNLEASE_DATABASE_URL"] == {"secretKeyRef": {"name": "pg", "key": "dsn"}}


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_every_spec_field_reaches_the_manifests() -> None:
    spec = parse("batch", "ml", FULL)
    deployment = build_deployment(spec, OWNER, replicas=3)
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert deployment["metadata"]["namespace"] == "ml"
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert (container["image"], container["imagePullPolicy"]) == ("ghcr.io/acme/agents:1.2",
                                                                  "Always")
    assert container["args"] == ["worker"]
    assert container["resources"] == FULL["resources"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    env = env_of(deployment)
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["RUNLEASE_DATABASE_URL"] == {"secretKeyRef": {"name": "pg", "key": "dsn"}}
    # Behind PgBouncer in transaction mode: LISTEN direct, prepared statements off.
    assert env["RUNLEASE_LISTEN_DATABASE_URL"] == {
        "secretKeyRef": {"name": "pg-direct", "key": "dsn"}}
    assert env["RUNLEASE_PREPARED_STATEMENTS"] == "false"
    assert (env["RUNLEASE_POOL"], env["RUNLEASE_AGENT"]) == ("batch-pool", "acme.agents:main")
    assert (env["RUNLEASE_CONCURRENCY"],
            env["RUNLEASE_HEARTBEAT_INTERVAL_S"], env["RUNLEASE_DRAIN_GRACE_S"],
            env["RUNLEASE_METRICS_PORT"]) == ("7", "10.0", "20", "9100")
    # The lease is the pool row's (the operator writes spec.leaseSeconds there):
    # workers read it, so it is not said twice.
    assert "RUNLEASE_LEASE_S" not in env
    assert env["OPENAI_BASE_URL"] == "http://llm:8000/v1"
    assert pod["terminationGracePeriodSeconds"] == 45
    assert pod["nodeSelector"] == {"pool": "agents"}
    assert pod["tolerations"] == FULL["tolerations"]
    assert pod["affinity"] == FULL["affinity"]
    assert pod["serviceAccountName"] == "agents"
    assert pod["imagePullSecrets"] == [{"name": "registry"}, {"name": "mirror.example"}]
    template_meta = deployment["spec"]["template"]["metadata"]
    assert template_meta["annotations"] == {"example.com/team": "ml"}
    assert template_meta["labels"]["team"] == "ml"
    assert template_meta["labels"]["runlease.dev/pool"] == "batch-pool"
    service = build_service(spec, OWNER)
    assert service["spec"]["ports"][0]["port"] == 9100
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    pdb = build_pdb(spec, OWNER)
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    for manifest in (deployment, service, pdb):
        assert manifest["metadata"]["ownerReferences"] == [{
            "apiVersion": "runlease.dev/v1alpha1", "kind": "AgentRunPool", "name": "batch",
            "uid": "uid-batch", "controller": True, "blockOwnerDeletion": True}]
    # Settings that live in the database, not in manifests:
    assert (spec.max_attempts, spec.priority_aging_s, spec.default_max_in_flight,
            spec.tenant_overrides) == (4, 30, 3, {"vip": TenantLimit(9)})
    assert (spec.replicas_min, spec.replicas_max, spec.target_runs_per_worker,
            spec.scale_down_delay_s) == (2, 9, 0.5, 120)


def test_worker_pods_give_a_tool_nothing_to_escalate_with() -> None:
    # A tool is a command a model chose (docs/operator.md, pod security).
    pod = build_deployment(parse("batch", "ml", FULL), OWNER, replicas=1)["spec"]["template"]
    spec = pod["spec"]
    container = spec["containers"][0]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    # The tool sandbox (on by default) makes user namespaces and mounts a
    # fresh /proc: a user-namespaced pod, an unmasked /proc, and a seccomp
    # profile that allows unshare(2) (docs/security.md, 'Tools').
    assert security["seccompProfile"] == {"type": "Unconfined"}
    assert security["procMount"] == "Unmasked"
    assert spec["hostUsers"] is False
    assert spec["securityContext"] == {"runAsNonRoot": True,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    assert spec["automountServiceAccountToken"] is False
    # The only writable places: emptyDirs at /tmp and at the tools' working
    # directory, which is also their HOME; TMPDIR points at /tmp.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert set(mounts) == {"/tmp", "/work"}
    assert all(volumes[name]["emptyDir"] == {} for name in mounts.values())
    assert container["workingDir"] == "/work"
    env = env_of({"spec": {"template": pod}})
    assert (env["HOME"], env["TMPDIR"]) == ("/work", "/tmp")


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, "1.31", "1.34"])
@pytest.mark.parametrize("spec", [FULL, MINIMAL],
                         ids=["full", "minimal"])
def test_built_manifests_are_valid_kubernetes(spec: dict[str, Any], version: str) -> None:
    for manifest in build_all(parse("batch", "ml", spec), OWNER, replicas=2):
        assert kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"image": ""}, "spec.image"),
        ({"agent": "not a callable"}, "spec.agent"),
        ({"pool": "Bad_Pool"}, "spec.pool"),
        ({"database": {}}, "spec.database.secretKeyRef"),
        ({"replicas": {"min": 5, "max": 2}}, "spec.replicas.min"),
        ({"lease": {"durationSeconds": 10, "heartbeatSeconds": 5}}, "heartbeatSeconds"),
        ({"drainGraceSeconds": 50, "terminationGracePeriodSeconds": 50}, "terminationGrace"),
        ({"concurrencyPerWorker": 0}, "spec.concurrencyPerWorker"),
        ({"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
        ({"tenants": {"overrides": [{"tenant": "a", "maxInFlight": 1},
                                    {"tenant": "a", "maxInFlight": 2}]}}, "twice"),
        # What the store would refuse is refused here, not retried forever.
        ({"tenants": {"overrides": [{"tenant": "team a", "maxInFlight": 1}]}},
         r"overrides\[\]\.tenant"),
        ({"tenants": {"overrides": [{"tenant": "a", "maxInFlight": 2_000_000}]}},
         r"overrides\[a\]\.maxInFlight"),
        ({"tenants": {"overrides": [{"tenant": "a", "priorityMin": 5, "priorityMax": 1}]}},
         r"overrides\[a\]\.priority_min"),
        ({"tenants": {"overrides": [{"tenant": "a", "priorityMax": 101}]}},
         r"overrides\[a\]\.priority_max"),
        ({"tenants": {"overrides": [{"tenant": "a", "submitsPerMinute": 0}]}},
         r"overrides\[a\]\.submitsPerMinute"),
        ({"tenants": {"overrides": [{"tenant": "a", "tokensPerMinute": "lots"}]}},
         r"overrides\[a\]\.tokensPerMinute"),
        ({"toolEnv": ["RUNLEASE_DATABASE_URL"]}, r"spec\.toolEnv.*worker's own"),
        ({"toolEnv": ["DATABASE_URL"]}, r"spec\.toolEnv"),
        ({"toolEnv": ["PGPASSWORD"]}, r"spec\.toolEnv"),
        ({"toolEnv": ["lower"]}, r"spec\.toolEnv"),
        ({"toolEnv": [""]}, r"spec\.toolEnv"),
        ({"toolEnv": [f"V{i}" for i in range(65)]}, r"spec\.toolEnv"),
        ({"paused": "yes"}, r"spec\.paused"),
        ({"database": {"secretKeyRef": {"name": "pg"}, "preparedStatements": "no"}},
         r"spec\.database\.preparedStatements"),
        ({"database": {"secretKeyRef": {"name": "pg"}, "listenSecretKeyRef": {"key": "k"}}},
         r"spec\.database\.listenSecretKeyRef\.name"),
        ({"database": {"secretKeyRef": {"name": "pg"},
                       "listenSecretKeyRef": {"name": "pg", "key": "a/b"}}},
         r"spec\.database\.listenSecretKeyRef\.key"),
        # Passed through to the pod, checked against the Kubernetes types.
        ({"env": [{"name": "A", "valeu": "b"}]}, r"spec\.env\[0\]\.valeu"),
        ({"env": [{"value": "b"}]}, r"spec\.env\[0\]\.name"),
        ({"tolerations": [{"key": "a", "effekt": "NoSchedule"}]}, r"spec\.tolerations\[0\]"),
        ({"affinity": {"nodeAfinity": {}}}, r"spec\.affinity\.nodeAfinity"),
        ({"resources": {"request": {"cpu": "1"}}}, r"spec\.resources\.request"),
        ({"retentionSeconds": -1}, r"spec\.retentionSeconds"),
    ],
)
def test_a_bad_spec_is_refused_with_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec, match=field):
        parse("batch", "ml", FULL | change)


@pytest.mark.parametrize("name", HOSTILE_NAMES)
@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("spec.database.secretKeyRef.name",
         lambda v: {"database": {"secretKeyRef": {"name": v}}}),
        ("spec.database.listenSecretKeyRef.name",
         lambda v: {"database": {"secretKeyRef": {"name": "pg"},
                                 "listenSecretKeyRef": {"name": v}}}),
        ("spec.serviceAccountName", lambda v: {"serviceAccountName": v}),
        (r"spec.imagePullSecrets\[1\].name",
         lambda v: {"imagePullSecrets": [{"name": "ok"}, {"name": v}]}),
    ],
    ids=["secret", "listen-secret", "service-account", "pull-secret"],
)
def test_a_name_that_is_a_path_is_refused(field: str, change: Any, name: str) -> None:
    with pytest.raises(InvalidSpec, match=rf"^{field} must "):
        parse("batch", "ml", FULL | change(name))


@pytest.mark.parametrize("name", [*HOSTILE_NAMES, "a.b", "x" * 51])
def test_a_pool_name_that_is_not_a_label_is_refused(name: str) -> None:
    with pytest.raises(InvalidSpec, match=r"^metadata\.name must "):
        parse(name, "ml", FULL)


def test_the_default_pool_is_the_name_and_must_be_a_valid_pool() -> None:
    minimal = {k: FULL[k] for k in ("image", "agent", "database")}
    assert parse("gpu-batch", "ml", minimal).pool == "gpu-batch"
    with pytest.raises(InvalidSpec, match=r"metadata\.name"):
        parse("Gpu.Batch", "ml", minimal)


def test_autoscaling_up_at_once_down_after_the_delay() -> None:
    from datetime import UTC, datetime, timedelta

    spec = parse("batch", "ml", FULL | {"replicas": {"min": 1, "max": 10}})
    # 7 slots x 0.5 = 3.5 runs per worker
    assert [wanted(spec, d) for d in (0, 1, 4, 35, 1000)] == [1, 1, 2, 10, 10]
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    up = decide(spec, current=2, depth=20, low_since=None, now=t0)
    assert (up.replicas, up.low_since, up.changed) == (6, None, True)
    low = decide(spec, current=6, depth=0, low_since=None, now=t0)
    assert (low.replicas, low.low_since, low.changed) == (6, t0, False)
    still = decide(spec, current=6, depth=0, low_since=t0, now=t0 + timedelta(seconds=119))
    assert still.replicas == 6
    down = decide(spec, current=6, depth=0, low_since=t0, now=t0 + timedelta(seconds=120))
    assert (down.replicas, down.low_since, down.changed) == (1, None, True)
    back = decide(spec, current=6, depth=30, low_since=t0, now=t0 + timedelta(seconds=60))
    assert (back.replicas, back.low_since) == (9, None)  # demand returned: delay reset
    fixed = parse("batch", "ml", FULL | {"autoscaling": {"enabled": False}})
    assert decide(fixed, current=5, depth=999, low_since=None, now=t0).replicas == 2


def test_queue_gauges_of_a_tenant_that_left_are_removed() -> None:
    from prometheus_client import generate_latest

    from runlease.db.store import QueueStats
    from runlease.operator.gauges import export
    from runlease.operator.status import Observed

    spec = parse("gauges", "ml", FULL | {"pool": "gauges-pool"})
    first = QueueStats({"acme": (3, 2, 1), "globex": (1, 1, 0)}, {"fatal": 2}, 4.0)
    export(spec, Observed(1, 1, 1, 1, first, 0))
    text = generate_latest().decode()
    assert 'runlease_queue_runs{pool="gauges-pool",status="pending",tenant="globex"} 1.0' in text
    assert 'runlease_dead_runs{error_code="fatal",pool="gauges-pool"} 2.0' in text
    second = QueueStats({"acme": (0, 0, 1)}, {}, 0.0)
    export(spec, Observed(1, 1, 1, 1, second, 0))
    text = generate_latest().decode()
    # The registry is the process's: other tests' pools may have a globex too.
    ours = [line for line in text.splitlines() if 'pool="gauges-pool"' in line]
    assert ours
    assert not [line for line in ours if 'tenant="globex"' in line]
    assert 'error_code="fatal",pool="gauges-pool"' not in text
    assert 'runlease_queue_runs{pool="gauges-pool",status="leased",tenant="acme"} 1.0' in text


def test_a_pass_decides_on_demand_and_reports_what_it_saw() -> None:
    from datetime import UTC, datetime

    from runlease.db.store import QueueStats
    from runlease.operator.pool_pass import Observation, plan, report

    spec = parse("split", "ml", FULL | {"pool": "split-pool", "concurrencyPerWorker": 1,
                                        "autoscaling": {"targetRunsPerWorker": 1}})
    deployment = {"spec": {"replicas": 3},
                  "status": {"replicas": 3, "readyReplicas": 1, "updatedReplicas": 3}}
    # 1,000 ready, of which a capped tenant may start 2; one run leased.
    seen = Observation(deployment, 3, QueueStats({"capped": (1000, 1000, 1)}, {}, 5.0),
                       startable=2, lease_expiries=0)
    assert seen.demand == 3
    when = datetime(2026, 12, 1, tzinfo=UTC)
    decision = plan(spec, seen, None, when)
    assert decision.replicas == 3  # not replicas.max: the backlog cannot start
    status = report(spec, seen, decision, {}, when)
    assert (status["replicas"], status["readyReplicas"], status["desiredReplicas"]) == (3, 1, 3)
    assert status["queue"]["pending"] == 1000
    assert status["pool"] == "split-pool"
    assert status["scaleDownSince"] is None


GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("label", ["full", "minimal"])
def test_manifests_are_those_of_the_dict_builders(label: str) -> None:
    """golden/*.json are the manifests the builders made as plain dicts,
    before they were built from the kubernetes client's typed models: the
    typed builders must serialise to exactly these (nothing changes by accident)."""
    spec = FULL if label == "full" else MINIMAL
    built = [serialize(m) for m in build_all(parse("batch", "ml", spec), OWNER, replicas=2)]
    assert built == json.loads((GOLDEN / f"{label}.json").read_text())


def test_kopf_logs_in_with_the_clients_configuration(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from runlease.operator.k8s import connection_info, load_configuration

    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://k8s.example:6443",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "s3cret"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(path))  # after import: read at call time
    info = connection_info(load_configuration())
    assert (info.server, info.scheme, info.token, info.insecure) == (
        "https://k8s.example:6443", "Bearer", "s3cret", True)


def test_scheduling_and_env_sources_reach_the_pod() -> None:
    extra = {
        "priorityClassName": "agents-high",
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "ScheduleAnyway",
                                       "labelSelector": {"matchLabels": {"team": "ml"}}}],
        "envFrom": [{"configMapRef": {"name": "agent-config"}},
                    {"secretRef": {"name": "agent-keys"}, "prefix": "AGENT_"}],
    }
    deployment = build_deployment(parse("batch", "ml", FULL | extra), OWNER, replicas=1)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "agents-high"
    assert pod["topologySpreadConstraints"] == extra["topologySpreadConstraints"]
    assert pod["containers"][0]["envFrom"] == extra["envFrom"]
    for version in (OLDEST_KUBERNETES, "1.34"):
        assert kubernetes_validate.validate(deployment, version, strict=True)
    with pytest.raises(InvalidSpec, match=r"spec\.envFrom\[0\]\.configMapRf"):
        parse("batch", "ml", FULL | {"envFrom": [{"configMapRf": {"name": "x"}}]})
    with pytest.raises(InvalidSpec, match=r"spec\.priorityClassName must"):
        parse("batch", "ml", FULL | {"priorityClassName": "../x"})


def _pod(spec: dict[str, Any]) -> dict[str, Any]:
    built = build_deployment(parse("batch", "ml", spec), OWNER, replicas=1)
    return dict(built["spec"]["template"])


def test_the_tool_sandbox_reaches_the_workers_settings() -> None:
    pod = _pod(MINIMAL | {"toolSandbox": {
        "network": False, "maxProcesses": 64, "memoryMiB": 512, "cpuSeconds": 30,
        "fileSizeMiB": 8, "diskMiB": 100, "hidePaths": ["/data/secrets"],
        "seccompProfile": {"type": "Localhost", "localhostProfile": "bwrap.json"}}})
    env = env_of({"spec": {"template": pod}})
    assert {k: v for k, v in env.items() if k.startswith("RUNLEASE_TOOL")} == {
        "RUNLEASE_TOOL_SANDBOX": "true", "RUNLEASE_TOOL_NETWORK": "false",
        "RUNLEASE_TOOL_MAX_PROCESSES": "64", "RUNLEASE_TOOL_MEMORY_MIB": "512",
        "RUNLEASE_TOOL_CPU_S": "30", "RUNLEASE_TOOL_FILE_SIZE_MIB": "8",
        "RUNLEASE_TOOL_DISK_MIB": "100", "RUNLEASE_TOOL_HIDE_PATHS": "/data/secrets"}
    security = pod["spec"]["containers"][0]["securityContext"]
    assert security["seccompProfile"] == {"type": "Localhost",
                                          "localhostProfile": "bwrap.json"}
    # Defaults: the worker's own limits, sandbox and network on.
    env = env_of({"spec": {"template": _pod(MINIMAL)}})
    assert {k: v for k, v in env.items() if k.startswith("RUNLEASE_TOOL")} == {
        "RUNLEASE_TOOL_SANDBOX": "true", "RUNLEASE_TOOL_NETWORK": "true"}


def test_an_unsandboxed_pool_serves_one_tenant_unless_the_admin_names_it() -> None:
    from runlease.operator.spec import check_sandbox

    off = parse("batch", "ml", MINIMAL | {"toolSandbox": {"enabled": False}})
    with pytest.raises(InvalidSpec, match=r"toolSandbox\.tenant"):
        check_sandbox(off, ())
    with pytest.raises(InvalidSpec, match="--unsandboxed-pools"):
        check_sandbox(off, ("other/batch", "ml/batch2"))  # the opt-in names this pool
    check_sandbox(off, ("ml/batch",))
    one = parse("batch", "ml", MINIMAL | {"toolSandbox": {"enabled": False, "tenant": "acme"}})
    check_sandbox(one, ())
    pod = _pod(MINIMAL | {"toolSandbox": {"enabled": False, "tenant": "acme"}})
    env = env_of({"spec": {"template": pod}})
    assert (env["RUNLEASE_TOOL_SANDBOX"], env["RUNLEASE_TOOL_TENANT"]) == ("false", "acme")
    # Unsandboxed, the pod keeps the runtime's defaults.
    security = pod["spec"]["containers"][0]["securityContext"]
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "procMount" not in security
    assert "hostUsers" not in pod["spec"]
    admitted = env_of({"spec": {"template": _pod(MINIMAL | {"toolSandbox": {"enabled": False}})}})
    assert admitted["RUNLEASE_UNSANDBOXED_POOL"] == "batch"


@pytest.mark.parametrize(("box", "field"), [
    ({"enabled": "no"}, "spec.toolSandbox.enabled"),
    ({"maxProcesses": 1}, "spec.toolSandbox.maxProcesses"),
    ({"memoryMiB": True}, "spec.toolSandbox.memoryMiB"),
    ({"hidePaths": ["relative"]}, "spec.toolSandbox.hidePaths"),
    ({"hidePaths": ["/a/../etc"]}, "spec.toolSandbox.hidePaths"),
    ({"hidePaths": ["/a b"]}, "spec.toolSandbox.hidePaths"),
    ({"hidePaths": ["/x"] * 33}, "spec.toolSandbox.hidePaths"),
    ({"tenant": "a\nb"}, "spec.toolSandbox.tenant"),
    ({"seccompProfile": {"type": 7}}, "spec.toolSandbox.seccompProfile"),
])
def test_a_hostile_tool_sandbox_spec_is_refused(box: dict[str, Any], field: str) -> None:
    """A pool author cannot smuggle options into the worker's command line or
    environment through spec.toolSandbox: every value is typed and bounded."""
    with pytest.raises(InvalidSpec, match=re.escape(field)):
        parse("batch", "ml", MINIMAL | {"toolSandbox": box})
