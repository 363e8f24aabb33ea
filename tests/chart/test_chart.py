"""The Helm chart, with the real helm binary: lint, render, validate every
manifest against Kubernetes 1.31's schemas, the values schema, the CRD copy,
least-privilege RBAC against the operator's API calls, and what each
workload is given (args, env, probes, secrets, hooks)."""

from __future__ import annotations

import base64
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from runlease import cli
from runlease.api.app import build_registry
from runlease.operator.build import build_deployment
from runlease.operator.k8s import API_CALLS, API_CALLS_CLUSTERWIDE
from runlease.operator.spec import parse
from runlease.settings import ApiSettings, OperatorSettings, load, reference
from tests.chart.conftest import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    ROOT,
    VALUES_DIR,
    VALUES_FILES,
    Helm,
    by_kind,
    one,
)
from tests.operator.test_crd import to_json_schema

pytestmark = pytest.mark.chart

Render = Callable[..., list[dict[str, Any]]]
CASES = [pytest.param([], id="defaults")] + [pytest.param([p], id=p.stem) for p in VALUES_FILES]
FULLNAME = f"{RELEASE}-runlease"
# Kinds no bundled Kubernetes schema knows: the Prometheus Operator's are
# skipped; the chart's own custom resources are checked against their CRDs.
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


def values(name: str) -> Path:
    return VALUES_DIR / f"{name}.yaml"


def crd_schemas() -> dict[str, dict[str, Any]]:
    """kind -> JSON Schema of the CRDs in the chart's crds/ directory."""
    out = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        version = crd["spec"]["versions"][0]
        schema = to_json_schema(version["schema"]["openAPIV3Schema"])
        # The API server allows these at the root whether declared or not.
        for implicit in ("apiVersion", "kind", "metadata"):
            schema["properties"].setdefault(implicit, {})
        out[crd["spec"]["names"]["kind"]] = schema
    return out


def test_the_test_values_cover_the_required_cases() -> None:
    assert {p.stem for p in VALUES_FILES} >= {
        "minimal", "all-namespaces", "monitoring-ingress-sample", "existing-secrets"}


# -- lint, render, validate ------------------------------------------------------------

@pytest.mark.parametrize("files", CASES)
def test_helm_lint_strict(helm: Helm, files: list[Path]) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE,
            "--kube-version", KUBE_VERSION]
    for path in files:
        args += ["--values", str(path)]
    result = helm.run(*args)
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("files", CASES)
def test_every_rendered_manifest_is_valid(rendered: Render, files: list[Path]) -> None:
    docs = rendered(files)
    schemas = crd_schemas()
    seen = set()
    for doc in docs:
        kind, meta = doc["kind"], doc["metadata"]
        key = (kind, meta.get("namespace"), meta["name"])
        assert key not in seen, f"rendered twice: {key}"
        seen.add(key)
        if kind in PROMETHEUS_OPERATOR_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        if kind in schemas:
            jsonschema.validate(doc, schemas[kind], cls=jsonschema.Draft7Validator)
            continue
        # Raises ValidationError naming the field on any unknown or bad field.
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "Service", "ServiceAccount",
            "Job"} <= kinds
    assert {d["metadata"]["name"] for d in by_kind(docs, "CustomResourceDefinition")} == {
        "agentrunpools.runlease.dev", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"}


def test_the_chart_crd_is_a_byte_identical_copy() -> None:
    source = ROOT / "crds" / "agentrunpools.runlease.dev.yaml"
    copy = CHART / "crds" / "agentrunpools.runlease.dev.yaml"
    assert copy.read_bytes() == source.read_bytes(), (
        f"cp {source.relative_to(ROOT)} {copy.relative_to(ROOT)}")


def test_the_kopf_peering_crds_are_what_kopf_looks_for() -> None:
    for name, scope, kind in (("kopfpeerings.kopf.dev", "Namespaced", "KopfPeering"),
                              ("clusterkopfpeerings.kopf.dev", "Cluster",
                               "ClusterKopfPeering")):
        crd = yaml.safe_load((CHART / "crds" / f"{name}.yaml").read_text())
        kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)
        spec = crd["spec"]
        assert (crd["metadata"]["name"], spec["group"], spec["scope"],
                spec["names"]["kind"]) == (name, "kopf.dev", scope, kind)
        (version,) = spec["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
        # kopf writes each peer into status by a merge patch on the object
        # itself: no status subresource, unknown fields kept.
        assert "subresources" not in version
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True


# -- values and their schema -------------------------------------------------------------

BAD_VALUES = [
    pytest.param(["operator.replicas=two"], "replicas", id="string for a number"),
    pytest.param(["operator.unknownKey=1"], "unknownKey", id="unknown key"),
    pytest.param(["api.ingress.colour=red"], "colour", id="unknown nested key"),
    pytest.param(["image.pullPolicy=Sometimes"], "pullPolicy", id="bad enum"),
    pytest.param(["api.service.type=Internal"], "type", id="bad service type"),
    pytest.param(["operator.metricsPort=70000"], "metricsPort", id="port above range"),
    pytest.param(["operator.replicas=0"], "replicas", id="below minimum"),
    pytest.param(["prometheusRule.alerts.oldestPending.for=soon"], "for", id="bad duration"),
    pytest.param(["database.url=mysql://db/x"], "url", id="not a PostgreSQL URL"),
    pytest.param(["api.tokens=acme"], "tokens", id="tokens not tenant=token"),
]


@pytest.mark.parametrize(("sets", "field"), BAD_VALUES)
def test_the_values_schema_rejects_bad_values(helm: Helm, sets: list[str], field: str) -> None:
    result = helm.run(*helm.template_args(sets=sets), check=False)
    assert result.returncode != 0, f"helm accepted {sets}"
    assert "schema" in result.stderr, result.stderr
    # Helm 3 and 4 word it differently; both name the field.
    assert re.search(rf"\b{re.escape(field)}\b", result.stderr), result.stderr


CHART_CHECKS = [
    pytest.param(["samplePool.enabled=true", "operator.watchNamespaces={agents}"],
                 "does not watch", id="sample pool outside the watched namespaces"),
    pytest.param(["operator.standalone=true"], "standalone", id="standalone with 2 replicas"),
    pytest.param(["api.maxInputBytes=2000000"], "maxInputBytes", id="input above request"),
    pytest.param(["database.existingSecret="], "database", id="no database"),
    pytest.param(["operator.serviceAccount.create=false"], "operator.serviceAccount.name",
                 id="no ServiceAccount named"),
]


@pytest.mark.parametrize(("sets", "message"), CHART_CHECKS)
def test_the_chart_refuses_inconsistent_values(helm: Helm, sets: list[str],
                                               message: str) -> None:
    result = helm.run(*helm.template_args(sets=sets), check=False)
    assert result.returncode != 0, f"helm accepted {sets}"
    assert message in result.stderr, result.stderr


def _schema_paths(node: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths = set()
    for key, sub in node.get("properties", {}).items():
        paths.add((*prefix, key))
        paths |= _schema_paths(sub, (*prefix, key))
    return paths


def _values_keys(text: str) -> dict[tuple[str, ...], bool]:
    """Each mapping key of values.yaml outside lists -> whether a `#` comment
    line stands right above it."""
    keys: dict[tuple[str, ...], bool] = {}
    stack: list[tuple[int, str]] = []
    list_indent: int | None = None
    previous = ""
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("- ") and list_indent is None:
            list_indent = indent
        match = re.match(r"^( *)([A-Za-z_][\w-]*):(\s|$)", line)
        if match and (list_indent is None or indent < list_indent):
            list_indent = None
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = (*(k for _, k in stack), match.group(2))
            keys[path] = previous.startswith("#")
            stack.append((indent, match.group(2)))
        if stripped:
            previous = stripped
    return keys


def test_every_value_is_commented_and_declared_in_the_schema() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    declared = _schema_paths(schema) - {("global",)}
    keys = _values_keys((CHART / "values.yaml").read_text())
    chart_keys = {k: v for k, v in keys.items() if k in declared}
    uncommented = sorted(".".join(k) for k, commented in chart_keys.items() if not commented)
    assert not uncommented, f"keys without a comment above them: {uncommented}"
    # Every chart-defined key is in values.yaml (so it is documented there),
    # but for the fields of Kubernetes types...
    missing = sorted(".".join(k) for k in declared if k not in keys
                     and not _inside_kubernetes_object(schema, k))
    assert not missing, f"in values.schema.json, not in values.yaml: {missing}"
    # ...and everything in values.yaml is either declared or part of a
    # free-form Kubernetes object (securityContext, resources...).
    undeclared = sorted(".".join(k) for k in keys if k not in declared
                        and not _inside_free_form(schema, k))
    assert not undeclared, f"in values.yaml, not in values.schema.json: {undeclared}"
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(defaults, schema, cls=jsonschema.Draft7Validator)


def _inside_kubernetes_object(schema: dict[str, Any], path: tuple[str, ...]) -> bool:
    """Whether path is a field of a Kubernetes type (securityContext,
    resources...): the schema lists such fields, values.yaml sets a few."""
    node = schema
    for key in path[:-1]:
        node = node["properties"][key]
        if str(node.get("description", "")).startswith("Kubernetes "):
            return True
    return False


def _inside_free_form(schema: dict[str, Any], path: tuple[str, ...]) -> bool:
    node = schema
    for key in path:
        props = node.get("properties")
        if props is None or key not in props:
            return node.get("type") == "object" and node.get("additionalProperties") is not False
        node = props[key]
    return False


def test_the_values_schema_is_strict_at_every_level() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)

    def walk(node: dict[str, Any], where: str) -> None:
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{where or '/'} is not closed"
            for key, sub in node["properties"].items():
                walk(sub, f"{where}/{key}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{where}[]")
        assert "type" in node or where == "/global", f"{where} has no type"

    walk(schema, "")


# -- RBAC ------------------------------------------------------------------------------------

def _needed(all_namespaces: bool) -> set[tuple[str, str, str]]:
    # A cluster-wide kopf peers through ClusterKopfPeering, never through the
    # namespaced KopfPeering: runlease.operator.k8s lists both sets.
    return set(API_CALLS_CLUSTERWIDE if all_namespaces else API_CALLS)


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    out = set()
    for rule in role["rules"]:
        for field in ("verbs", "apiGroups", "resources"):
            assert "*" not in rule[field], f"wildcard in {role['metadata']['name']}: {rule}"
        assert "resourceNames" not in rule
        assert "nonResourceURLs" not in rule
        out |= {(v, g, r) for v in rule["verbs"] for g in rule["apiGroups"]
                for r in rule["resources"]}
    return out


def _bound(docs: list[dict[str, Any]], binding_kind: str, role_kind: str,
           namespace: str | None) -> set[tuple[str, str, str]]:
    """Grants of the roles bound to the operator's ServiceAccount."""
    sa = one(docs, "ServiceAccount", "-operator")["metadata"]["name"]
    grants: set[tuple[str, str, str]] = set()
    for binding in by_kind(docs, binding_kind):
        if binding["metadata"].get("namespace") != namespace:
            continue
        if {"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE} not in (
                binding["subjects"]):
            continue
        ref = binding["roleRef"]
        assert ref["kind"] == role_kind
        (role,) = [r for r in by_kind(docs, role_kind) if r["metadata"]["name"] == ref["name"]
                   and r["metadata"].get("namespace") == namespace]
        grants |= _grants(role)
    return grants


@pytest.mark.parametrize("files", [
    pytest.param([], id="defaults"),
    pytest.param([values("monitoring-ingress-sample")], id="three-namespaces"),
])
def test_rbac_namespaced_covers_every_api_call_and_no_more(rendered: Render,
                                                           files: list[Path]) -> None:
    docs = rendered(files)
    operator = one(docs, "Deployment", "-operator")["spec"]["template"]["spec"]
    args = operator["containers"][0]["args"]
    namespaces = [a.split("=", 1)[1] for a in args if a.startswith("--namespaces=")]
    assert namespaces, args
    cluster = _bound(docs, "ClusterRoleBinding", "ClusterRole", None)
    assert {r for _, _, r in cluster} == {"customresourcedefinitions"}, (
        "a namespaced operator gets only cluster-scoped reads cluster-wide")
    for ns in namespaces:
        grants = _bound(docs, "RoleBinding", "Role", ns) | cluster
        missing = sorted(_needed(False) - grants)
        assert not missing, f"in {ns}, RBAC lacks {missing}"
        excess = sorted(grants - _needed(False))
        assert not excess, f"in {ns}, RBAC grants more than the operator uses: {excess}"
    assert {r["metadata"]["namespace"] for r in by_kind(docs, "Role")} == set(namespaces)


def test_rbac_all_namespaces_covers_every_api_call_and_no_more(rendered: Render) -> None:
    docs = rendered([values("all-namespaces")])
    assert not by_kind(docs, "Role")
    assert not by_kind(docs, "RoleBinding")
    grants = _bound(docs, "ClusterRoleBinding", "ClusterRole", None)
    missing = sorted(_needed(True) - grants)
    assert not missing, f"RBAC lacks {missing}"
    excess = sorted(grants - _needed(True))
    assert not excess, f"RBAC grants more than the operator uses: {excess}"


@pytest.mark.parametrize("files", [[], [values("all-namespaces")]],
                         ids=["namespaced", "all-namespaces"])
def test_every_rbac_rule_says_why(helm: Helm, files: list[Path]) -> None:
    text = helm.run(*helm.template_args(files), "--show-only", "templates/rbac.yaml").stdout
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if line.lstrip().startswith("- apiGroups:")]
    assert rules
    for i in rules:
        above = lines[i - 1].strip()
        assert above.startswith("#"), f"rule without a comment: {lines[i:i + 3]}"


# -- the workloads ---------------------------------------------------------------------------

def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_operator_peers_and_probes(rendered: Render) -> None:
    docs = rendered()
    deployment = one(docs, "Deployment", "-operator")
    assert deployment["spec"]["replicas"] == 2
    container = _container(deployment)
    assert container["args"] == ["operator", f"--namespaces={NAMESPACE}",
                                 f"--peering-name={FULLNAME}"]
    assert "--standalone" not in container["args"]
    env = _env(container)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["RUNLEASE_DATABASE_URL"] == {
        "secretKeyRef": {"name": "runlease-db", "key": "url"}}
    assert env["RUNLEASE_METRICS_PORT"] == "9465"
    assert container["ports"] == [{"name": "metrics", "containerPort": 9465, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == f"{FULLNAME}-operator"
    assert spec["securityContext"]["runAsNonRoot"] is True
    # The peering object kopf patches, named as the operator is told.
    (peering,) = by_kind(docs, "KopfPeering")
    assert (peering["metadata"]["name"], peering["metadata"]["namespace"]) == (
        FULLNAME, NAMESPACE)
    assert not by_kind(docs, "ClusterKopfPeering")
    assert one(docs, "PodDisruptionBudget", "-operator")["spec"]["maxUnavailable"] == 1


def test_the_operator_watches_every_listed_namespace(rendered: Render) -> None:
    docs = rendered([values("monitoring-ingress-sample")])
    args = _container(one(docs, "Deployment", "-operator"))["args"]
    watched = ["runlease", "agents", "batch-agents"]
    assert args == ["operator", *(f"--namespaces={ns}" for ns in watched),
                    "--peering-name=runlease-peering"]
    assert sorted(p["metadata"]["namespace"] for p in by_kind(docs, "KopfPeering")) == sorted(
        watched)
    assert {p["metadata"]["name"] for p in by_kind(docs, "KopfPeering")} == {"runlease-peering"}


def test_the_operator_all_namespaces(rendered: Render) -> None:
    docs = rendered([values("all-namespaces")])
    deployment = one(docs, "Deployment", "-operator")
    assert deployment["spec"]["replicas"] == 3
    assert _container(deployment)["args"] == ["operator", "--all-namespaces",
                                              f"--peering-name={FULLNAME}"]
    (peering,) = by_kind(docs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == FULLNAME
    assert "namespace" not in peering["metadata"]
    assert not by_kind(docs, "KopfPeering")
    workers = one(docs, "ServiceMonitor", "-workers")
    assert workers["spec"]["namespaceSelector"] == {"any": True}


def test_a_standalone_operator_has_no_peering(rendered: Render) -> None:
    docs = rendered(sets=["operator.standalone=true", "operator.replicas=1"])
    args = _container(one(docs, "Deployment", "-operator"))["args"]
    assert "--standalone" in args
    assert not any(a.startswith("--peering") for a in args)
    assert not by_kind(docs, "KopfPeering")
    assert not by_kind(docs, "ClusterKopfPeering")
    assert not [p for p in by_kind(docs, "PodDisruptionBudget")
                if p["metadata"]["name"].endswith("-operator")]


def test_the_api_listens_on_all_addresses_with_probes(rendered: Render) -> None:
    docs = rendered()
    deployment = one(docs, "Deployment", "-api")
    container = _container(deployment)
    assert container["args"] == ["api", "--host", "0.0.0.0", "--port", "8080"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    service = one(docs, "Service", "-api")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    env = _env(container)
    # No tokens configured by default: none referenced (NOTES.txt warns).
    assert "RUNLEASE_TOKENS" not in env
    # Every replica signs stream tokens with one key, made by the chart.
    secret = one(docs, "Secret", "-api-stream")
    assert env["RUNLEASE_STREAM_TOKEN_SECRET"] == {"secretKeyRef": {
        "name": secret["metadata"]["name"], "key": "stream-token-secret"}}
    assert len(base64.b64decode(secret["data"]["stream-token-secret"])) == 48


def test_secrets_made_by_the_chart(rendered: Render) -> None:
    docs = rendered([values("minimal")])
    url = "postgresql://runlease:secret@postgres.db.svc:5432/runlease"
    database = one(docs, "Secret", "-database")
    assert base64.b64decode(database["data"]["url"]).decode() == url
    tokens = one(docs, "Secret", "-api-tokens")
    assert base64.b64decode(tokens["data"]["RUNLEASE_TOKENS"]).decode().startswith(
        "acme=sha256:")
    assert "RUNLEASE_ADMIN_TOKENS" not in tokens["data"]
    for deployment in by_kind(docs, "Deployment"):
        env = _env(_container(deployment))
        assert env["RUNLEASE_DATABASE_URL"] == {"secretKeyRef": {
            "name": database["metadata"]["name"], "key": "url"}}
    api = _env(_container(one(docs, "Deployment", "-api")))
    for name in ("RUNLEASE_TOKENS", "RUNLEASE_ADMIN_TOKENS"):
        assert api[name]["secretKeyRef"]["name"] == tokens["metadata"]["name"]
        assert api[name]["secretKeyRef"]["optional"] is True
    assert _container(one(docs, "Deployment", "-api"))["image"] == (
        "registry.example.com/runlease:0.1.0")


def test_existing_secrets_are_only_referenced(rendered: Render) -> None:
    docs = rendered([values("existing-secrets")])
    assert not by_kind(docs, "Secret"), "the chart must make no Secret here"
    api = _env(_container(one(docs, "Deployment", "-api")))
    assert api["RUNLEASE_DATABASE_URL"] == {"secretKeyRef": {
        "name": "pg-credentials", "key": "DATABASE_URL"}}
    assert api["RUNLEASE_TOKENS"]["secretKeyRef"]["name"] == "runlease-api-tokens"
    assert api["RUNLEASE_TOKENS"]["secretKeyRef"]["key"] == "RUNLEASE_TOKENS"
    assert api["RUNLEASE_ADMIN_TOKENS"]["secretKeyRef"]["key"] == "RUNLEASE_ADMIN_TOKENS"
    assert api["RUNLEASE_STREAM_TOKEN_SECRET"] == {"secretKeyRef": {
        "name": "runlease-api-stream", "key": "signing-key"}}
    assert api["RUNLEASE_CONSOLE_SECRET"] == {"secretKeyRef": {
        "name": "runlease-api-console", "key": "session-key"}}
    job = one(docs, "Job", "-migrate")
    job_env = _env(job["spec"]["template"]["spec"]["containers"][0])
    assert job_env["RUNLEASE_DATABASE_URL"] == api["RUNLEASE_DATABASE_URL"]
    sa = one(docs, "ServiceAccount", "")
    assert sa["metadata"]["name"] == "runlease-operator"
    operator = one(docs, "Deployment", "-operator")["spec"]["template"]["spec"]
    assert operator["serviceAccountName"] == "runlease-operator"
    assert operator["imagePullSecrets"] == [{"name": "registry"}]


def test_api_replicas_share_one_console_secret(rendered: Render) -> None:
    """docs/console.md: every replica signs sessions with the same key, or a
    sign-in made on one pod is refused by the other. The chart used to set
    none, so each pod made its own."""
    docs = rendered([values("minimal")], ["api.replicas=2"])
    deployment = one(docs, "Deployment", "-api")
    assert deployment["spec"]["replicas"] == 2
    secret = one(docs, "Secret", "-api-console")
    # Both replicas are pods of this one template: one reference, one key.
    env = _env(_container(deployment))
    assert env["RUNLEASE_CONSOLE_SECRET"] == {"secretKeyRef": {
        "name": secret["metadata"]["name"], "key": "console-secret"}}
    assert len(base64.b64decode(secret["data"]["console-secret"])) == 48
    # Not the stream tokens' key: each secret signs one kind of thing.
    assert secret["data"] != one(docs, "Secret", "-api-stream")["data"]


def test_migrations_run_as_a_pre_install_and_pre_upgrade_hook(rendered: Render) -> None:
    docs = rendered([values("minimal")])
    job = one(docs, "Job", "-migrate")
    hooks = job["metadata"]["annotations"]
    assert set(hooks["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["args"] == ["migrate"]
    # Hooks run before the release's own Secret exists: the Job's copy of the
    # URL is a hook too, created first (lower weight).
    ref = _env(pod["containers"][0])["RUNLEASE_DATABASE_URL"]["secretKeyRef"]
    (secret,) = [s for s in by_kind(docs, "Secret")
                 if s["metadata"]["name"] == ref["name"]]
    secret_hooks = secret["metadata"]["annotations"]
    assert secret_hooks["helm.sh/hook"] == hooks["helm.sh/hook"]
    assert int(secret_hooks["helm.sh/hook-weight"]) < int(hooks["helm.sh/hook-weight"])
    assert "hook-succeeded" in secret_hooks["helm.sh/hook-delete-policy"]


def test_no_migrations_job_when_turned_off(rendered: Render) -> None:
    docs = rendered(sets=["migrations.enabled=false"])
    assert not by_kind(docs, "Job")


def _pod_environ(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet would make it; Secrets the
    chart does not make get a stand-in value."""
    secrets = {s["metadata"]["name"]: s for s in by_kind(docs, "Secret")}
    env = {}
    for item in container["env"]:
        source = item.get("valueFrom", {})
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in source:
            env[item["name"]] = "pod-0"
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            secret = secrets.get(ref["name"])
            if secret is not None and ref["key"] in secret["data"]:
                env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
            elif not ref.get("optional"):
                env[item["name"]] = "postgresql://u:p@db/x" if "DATABASE" in item["name"] \
                    else "a-stand-in-secret-value"
    return env


@pytest.mark.parametrize("files", CASES)
def test_the_processes_accept_their_args_and_environment(rendered: Render,
                                                         files: list[Path]) -> None:
    """What the chart passes parses and validates as runlease's own settings
    (the same code path as `runlease operator` / `runlease api` at start)."""
    docs = rendered(files)
    operator = _container(one(docs, "Deployment", "-operator"))
    env = _pod_environ(docs, operator)
    assert operator["args"][0] == "operator"
    ctx = cli.operator.make_context("operator", list(operator["args"][1:]))
    settings = load(OperatorSettings, ctx.params, environ=env)
    assert settings.metrics_port == operator["ports"][0]["containerPort"]
    assert settings.database_url
    assert settings.all_namespaces or settings.namespaces
    api = _container(one(docs, "Deployment", "-api"))
    ctx = cli.api.make_context("api", list(api["args"][1:]))
    api_settings = load(ApiSettings, ctx.params, environ=_pod_environ(docs, api))
    assert (api_settings.host, api_settings.port) == ("0.0.0.0", api["ports"][0]["containerPort"])
    assert api_settings.stream_token_secret
    build_registry(api_settings)  # tokens, if any, are well formed
    # No RUNLEASE_* variable that the process does not read (a typo would be
    # silently ignored). RUNLEASE_LOG_LEVEL is read by the `runlease` group.
    for container, cls in ((operator, OperatorSettings), (api, ApiSettings)):
        known = {name for row in reference(cls) for name in row["env"].split(", ")}
        unknown = {name for name in _env(container)
                   if name.startswith("RUNLEASE_")} - known - {"RUNLEASE_LOG_LEVEL"}
        assert not unknown, f"{container['name']}: {unknown}"


def test_ingress_and_monitoring_and_the_sample_pool(rendered: Render) -> None:
    docs = rendered([values("monitoring-ingress-sample")])
    ingress = one(docs, "Ingress", "-api")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]
    assert backend == {"service": {"name": f"{FULLNAME}-api", "port": {"name": "http"}}}
    monitors = {m["metadata"]["name"]: m for m in by_kind(docs, "ServiceMonitor")}
    assert set(monitors) == {f"{FULLNAME}-operator", f"{FULLNAME}-api", f"{FULLNAME}-workers"}
    for monitor in monitors.values():
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitors[f"{FULLNAME}-operator"]["spec"]["endpoints"][0]["honorLabels"] is True
    assert monitors[f"{FULLNAME}-workers"]["spec"]["namespaceSelector"] == {
        "matchNames": ["runlease", "agents", "batch-agents"]}
    operator_service = one(docs, "Service", "-operator-metrics")
    assert operator_service["spec"]["ports"][0]["port"] == 9465
    dashboard = one(docs, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    (pool,) = by_kind(docs, "AgentRunPool")
    assert pool["metadata"]["namespace"] == NAMESPACE
    assert pool["spec"]["image"] == "runlease:0.1.0"
    # The operator's own parser accepts it as the operator would.
    spec = parse(pool["metadata"]["name"], pool["metadata"]["namespace"], pool["spec"])
    assert spec.agent == "runlease.agents.script:agent"
    assert spec.database_secret == "runlease-db"


def test_behind_pgbouncer_every_process_gets_the_direct_url_and_no_prepared_statements(
        rendered: Render) -> None:
    docs = rendered([values("pgbouncer")])
    bouncer = {"secretKeyRef": {"name": "pg-bouncer", "key": "url"}}
    direct = {"secretKeyRef": {"name": "pg-direct", "key": "direct-url"}}
    api = _env(_container(one(docs, "Deployment", "-api")))
    assert api["RUNLEASE_DATABASE_URL"] == bouncer
    assert api["RUNLEASE_LISTEN_DATABASE_URL"] == direct
    assert api["RUNLEASE_PREPARED_STATEMENTS"] == "false"
    operator = _env(_container(one(docs, "Deployment", "-operator")))
    assert operator["RUNLEASE_DATABASE_URL"] == bouncer
    assert operator["RUNLEASE_PREPARED_STATEMENTS"] == "false"
    assert "RUNLEASE_LISTEN_DATABASE_URL" not in operator  # the operator never LISTENs
    # Migrators hold a session advisory lock: the direct URL.
    job = one(docs, "Job", "-migrate")
    assert _env(job["spec"]["template"]["spec"]["containers"][0])[
        "RUNLEASE_DATABASE_URL"] == direct
    # The sample pool's workers, through the operator's builders.
    (pool,) = by_kind(docs, "AgentRunPool")
    spec = parse(pool["metadata"]["name"], pool["metadata"]["namespace"], pool["spec"])
    assert (spec.database_secret, spec.listen_secret, spec.listen_key,
            spec.prepared_statements) == ("pg-bouncer", "pg-direct", "direct-url", False)
    worker = _env(_container(build_deployment(spec, {"metadata": {"name": "p", "uid": "u"}},
                                              replicas=1)))
    assert worker["RUNLEASE_LISTEN_DATABASE_URL"] == direct
    assert worker["RUNLEASE_PREPARED_STATEMENTS"] == "false"


def test_a_direct_database_adds_no_pgbouncer_settings(rendered: Render) -> None:
    docs = rendered([values("monitoring-ingress-sample")])
    for name in ("-api", "-operator"):
        env = _env(_container(one(docs, "Deployment", name)))
        assert "RUNLEASE_LISTEN_DATABASE_URL" not in env
        assert "RUNLEASE_PREPARED_STATEMENTS" not in env
    (pool,) = by_kind(docs, "AgentRunPool")
    assert "listenSecretKeyRef" not in pool["spec"]["database"]
    assert pool["spec"]["database"]["preparedStatements"] is True


def test_every_pod_gives_its_processes_nothing_to_escalate_with(rendered: Render) -> None:
    # The chart's own pods, and the worker pods its sample pool gets from the
    # operator (a worker runs tools a model chose: docs/operator.md).
    docs = rendered([values("monitoring-ingress-sample")])
    (pool,) = by_kind(docs, "AgentRunPool")
    workers = build_deployment(parse(pool["metadata"]["name"], NAMESPACE, pool["spec"]),
                               {"metadata": {"name": "sample", "uid": "u"}}, replicas=1)
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"]
            for d in [*by_kind(docs, "Deployment"), *by_kind(docs, "Job"), workers]}
    assert len(pods) == 4  # operator, API, migrations, workers
    for name, pod in pods.items():
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        # Only the operator talks to the Kubernetes API.
        assert pod["automountServiceAccountToken"] is name.endswith("-operator"), name
        empty = {v["name"] for v in pod["volumes"] if v.get("emptyDir") == {}}
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["capabilities"] == {"drop": ["ALL"]}, name
            writable = {m["mountPath"] for m in container["volumeMounts"] if m["name"] in empty}
            assert "/tmp" in writable, name
    worker = pods[workers["metadata"]["name"]]["containers"][0]
    assert worker["workingDir"] == "/work"
    assert {m["mountPath"] for m in worker["volumeMounts"]} == {"/tmp", "/work"}


def test_by_default_no_prometheus_operator_objects(rendered: Render) -> None:
    kinds = {d["kind"] for d in rendered()}
    assert not kinds & PROMETHEUS_OPERATOR_KINDS
    assert "AgentRunPool" not in kinds


def test_notes_render(helm: Helm) -> None:
    for files, expected in (([], "WARNING: the API has no tokens"),
                            ([values("minimal")], "Database URL: Secret")):
        result = helm.run("install", RELEASE, str(CHART), "--dry-run=client", "--namespace",
                          NAMESPACE,
                          *(a for p in files for a in ("--values", str(p))))
        notes = result.stdout.split("NOTES:", 1)[1]
        assert expected in notes
        assert "<no value>" not in notes


def test_kubectl_runs(tool_bin: Path) -> None:
    result = subprocess.run([str(tool_bin / "kubectl"), "version", "--client"],
                            capture_output=True, text=True, timeout=60, check=True)
    assert "Client Version: v1." in result.stdout


def test_install_tools_is_quiet_and_fast_when_installed(tool_bin: Path, promtool: Path) -> None:
    result = subprocess.run([str(ROOT / "scripts" / "install-tools")], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")
