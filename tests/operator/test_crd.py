"""The CRD's openAPIV3Schema, checked offline with jsonschema.

The API server also prunes and (with strict field validation, kubectl's
default) rejects unknown fields, and evaluates the CEL rules; here unknown
fields are refused the same way, and the CEL rules, which jsonschema cannot
run, are the same checks spec.parse makes (tested in test_builders.py).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from runlease.db.models import TenantLimit
from runlease.operator import names
from runlease.operator.build import build_all
from runlease.operator.spec import parse
from tests.operator.hostile import HOSTILE_NAMES

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "agentrunpools.runlease.dev.yaml").read_text())


def to_json_schema(node: Any) -> Any:
    """Kubernetes structural schema -> JSON Schema, as the server applies it."""
    if isinstance(node, list):
        return [to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("nullable"):
        out.pop("nullable")
        out["type"] = [node["type"], "null"]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


SCHEMA = to_json_schema(CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
EXAMPLE = yaml.safe_load((ROOT / "examples" / "agentrunpool.yaml").read_text())


def validate(body: dict[str, Any]) -> None:
    jsonschema.validate(body, SCHEMA, cls=jsonschema.Draft7Validator)


def test_the_crd_declares_what_the_operator_needs() -> None:
    version = CRD["spec"]["versions"][0]
    assert (CRD["spec"]["group"], version["name"], CRD["spec"]["names"]["kind"]) == (
        "runlease.dev", "v1alpha1", "AgentRunPool")
    assert CRD["spec"]["names"]["shortNames"] == ["arp"]
    assert CRD["spec"]["scope"] == "Namespaced"
    assert set(version["subresources"]) == {"status", "scale"}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Ready", "Replicas", "Queued", "Running", "Dead", "Age"]
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def test_the_commented_example_is_valid() -> None:
    validate(EXAMPLE)
    spec = parse(EXAMPLE["metadata"]["name"], EXAMPLE["metadata"]["namespace"],
                 EXAMPLE["spec"])
    assert spec.tenant_overrides == {"enterprise-co": TenantLimit(100),
                                     "free-tier": TenantLimit(2, -10, 10, 600, 2_000_000)}


def test_a_minimal_pool_is_valid() -> None:
    validate({"apiVersion": "runlease.dev/v1alpha1", "kind": "AgentRunPool",
              "metadata": {"name": "p"},
              "spec": {"image": "x", "agent": "a:b",
                       "database": {"secretKeyRef": {"name": "db"}}}})


INVALID = [
    ("no image", lambda s: s.pop("image")),
    ("no agent", lambda s: s.pop("agent")),
    ("agent not module:callable", lambda s: s.update(agent="acme.agents")),
    ("no database", lambda s: s.pop("database")),
    ("secretKeyRef without name", lambda s: s["database"]["secretKeyRef"].pop("name")),
    ("unknown field", lambda s: s.update(replica=3)),
    ("unknown nested field", lambda s: s["lease"].update(seconds=5)),
    ("bad pull policy", lambda s: s.update(imagePullPolicy="Sometimes")),
    ("concurrency 0", lambda s: s.update(concurrencyPerWorker=0)),
    # A pool author's sandbox: typed and bounded at the API server too.
    ("sandbox: too few processes", lambda s: s.update(toolSandbox={"maxProcesses": 1})),
    ("sandbox: unknown field", lambda s: s.update(toolSandbox={"privileged": True})),
    ("sandbox: a relative hidden path", lambda s: s.update(toolSandbox={"hidePaths": ["x"]})),
    ("sandbox: a hidden path with a space", lambda s: s.update(
        toolSandbox={"hidePaths": ["/a b"]})),
    ("sandbox: enabled a string", lambda s: s.update(toolSandbox={"enabled": "no"})),
    ("concurrency a string", lambda s: s.update(concurrencyPerWorker="10")),
    ("target 0 (exclusive)", lambda s: s["autoscaling"].update(targetRunsPerWorker=0)),
    ("target over 1", lambda s: s["autoscaling"].update(targetRunsPerWorker=1.5)),
    ("negative min", lambda s: s["replicas"].update(min=-1)),
    ("max attempts 0", lambda s: s.update(maxAttempts=0)),
    ("pool with capitals", lambda s: s.update(pool="Batch")),
    ("override tenant with a space",
     lambda s: s["tenants"]["overrides"][0].update(tenant="team a")),
    ("override without tenant", lambda s: s["tenants"]["overrides"][0].pop("tenant")),
    ("override priority out of range",
     lambda s: s["tenants"]["overrides"][0].update(priorityMax=101)),
    ("retention negative", lambda s: s.update(retentionSeconds=-1)),
    ("paused a string", lambda s: s.update(paused="yes")),
    ("tool env lowercase", lambda s: s.update(toolEnv=["path"])),
    ("tool env not a list", lambda s: s.update(toolEnv="GITHUB_TOKEN")),
    ("node selector not strings", lambda s: s.update(nodeSelector={"a": 1})),
    ("lease too short", lambda s: s["lease"].update(durationSeconds=1)),
]


@pytest.mark.parametrize("mutate", [m for _, m in INVALID], ids=[n for n, _ in INVALID])
def test_invalid_pools_are_rejected(mutate: Any) -> None:
    body = copy.deepcopy(EXAMPLE)
    mutate(body["spec"])
    with pytest.raises(jsonschema.ValidationError):
        validate(body)


def test_the_crd_checks_names_as_spec_parse_does() -> None:
    spec = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    secret = spec["properties"]["database"]["properties"]["secretKeyRef"]["properties"]
    named = [secret["name"], spec["properties"]["serviceAccountName"],
             spec["properties"]["imagePullSecrets"]["items"]["properties"]["name"]]
    for schema in named:
        assert (schema["pattern"], schema["maxLength"]) == (
            names.SUBDOMAIN_PATTERN, names.SUBDOMAIN_MAX_CHARS)
    assert (secret["key"]["pattern"], secret["key"]["maxLength"]) == (
        names.SECRET_KEY_PATTERN, names.SUBDOMAIN_MAX_CHARS)


NAME_FIELDS = {
    "secret": lambda s, v: s["database"]["secretKeyRef"].update(name=v),
    "service account": lambda s, v: s.update(serviceAccountName=v),
    "pull secret": lambda s, v: s.update(imagePullSecrets=[{"name": v}]),
}


@pytest.mark.parametrize("name", HOSTILE_NAMES)
@pytest.mark.parametrize("field", list(NAME_FIELDS))
def test_the_crd_refuses_names_that_are_paths(field: str, name: str) -> None:
    body = copy.deepcopy(EXAMPLE)
    NAME_FIELDS[field](body["spec"], name)
    with pytest.raises(jsonschema.ValidationError):
        validate(body)


@pytest.mark.parametrize("key", ["..", ".", "a/b", "../url", "k" * 254])
def test_the_crd_refuses_secret_keys_that_are_paths(key: str) -> None:
    body = copy.deepcopy(EXAMPLE)
    body["spec"]["database"]["secretKeyRef"]["key"] = key
    if key not in (".", ".."):  # the schema's pattern allows these; spec.parse does not
        with pytest.raises(jsonschema.ValidationError):
            validate(body)
    with pytest.raises(ValueError, match=r"secretKeyRef\.key"):
        parse("p", "ns", body["spec"])


def test_kubectl_explain_has_a_description_for_every_field() -> None:
    root = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        for name, sub in (node.get("properties") or {}).items():
            if not sub.get("description"):
                missing.append(f"{path}.{name}")
            walk(sub, f"{path}.{name}")
        if "items" in node:
            walk(node["items"], f"{path}[]")

    walk(root["spec"], "spec")
    walk(root["status"], "status")
    assert missing == []


def test_kubectl_scale_sets_the_floor_as_the_docs_say() -> None:
    scale = CRD["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {"specReplicasPath": ".spec.replicas.min",
                     "statusReplicasPath": ".status.replicas",
                     "labelSelectorPath": ".status.selector"}
    docs = " ".join((ROOT / "docs" / "operator.md").read_text().split())
    assert "`kubectl scale arp/NAME --replicas=N` sets `replicas.min`" in docs


def docs_pools() -> list[dict[str, Any]]:
    text = (ROOT / "docs" / "operator.md").read_text()
    blocks = [yaml.safe_load(b.split("```", 1)[0]) for b in text.split("```yaml\n")[1:]]
    return [b for b in blocks if isinstance(b, dict) and b.get("kind") == "AgentRunPool"]


def test_each_example_pool_in_the_docs_is_valid() -> None:
    pools = docs_pools()
    assert len(pools) >= 7
    owner = {"metadata": {"name": "p", "uid": "uid-p"}}
    for body in pools:
        validate(body)
        spec = parse(body["metadata"]["name"], body["metadata"]["namespace"], body["spec"])
        for manifest in build_all(spec, owner, replicas=1):
            assert kubernetes_validate.validate(manifest, "1.31", strict=True)
