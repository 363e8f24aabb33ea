"""The docs' `doc-test: cluster` blocks, checked without a cluster: every
`helm install/upgrade` renders with the documented flags (`helm template`),
every namespace a command or manifest uses was created before (or rendered),
every file applied exists, a pool is applied in a namespace the installed
operator watches with a database Secret that was created there, the first
pool of installation.md runs the built-in script agent from the installed
image, a port-forwarded Service exists, and every `runlease` command exists.
installation.md is read first; the other docs follow it, as a reader would."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import Helm
from tests.docs.blocks import ROOT, Block, command_blocks

pytestmark = pytest.mark.chart

CLUSTER_KINDS = frozenset({"CustomResourceDefinition", "Namespace", "ClusterRole",
                           "ClusterRoleBinding", "ClusterKopfPeering"})


@dataclass
class Cluster:
    """What the commands read so far would have made."""

    helm: Helm
    namespaces: set[str] = field(default_factory=lambda: {"default", "kube-system"})
    secrets: set[tuple[str, str]] = field(default_factory=set)
    watched: set[str] = field(default_factory=set)
    all_namespaces: bool = False
    services: set[tuple[str, str]] = field(default_factory=set)
    image: str | None = None
    values: dict[str, list[str]] = field(default_factory=dict)  # --set of each release

    def need_namespace(self, ns: str, where: str) -> None:
        assert ns in self.namespaces, f"{where}: namespace {ns!r} is used before it is created"


def namespace_of(args: list[str]) -> str | None:
    for i, arg in enumerate(args):
        if arg in ("-n", "--namespace") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--namespace="):
            return arg.split("=", 1)[1]
    return None


def files_of(args: list[str]) -> list[Path]:
    return [ROOT / args[i + 1] for i, a in enumerate(args) if a == "-f" and i + 1 < len(args)]


def manifests(path: Path) -> list[dict[str, Any]]:
    paths = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]


def helm_release(cluster: Cluster, args: list[str], where: str) -> None:
    release, chart = args[2], args[3]
    ns = namespace_of(args) or "default"
    if "--create-namespace" in args:
        cluster.namespaces.add(ns)
    cluster.need_namespace(ns, where)
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    if "--reuse-values" in args:
        sets = [*cluster.values.get(release, []), *sets]
    cluster.values[release] = sets
    template = ["template", release, str(ROOT / chart), "--namespace", ns, "--include-crds"]
    for item in sets:
        template += ["--set", item]
    docs = [d for d in yaml.safe_load_all(cluster.helm.run(*template).stdout) if d]
    cluster.secrets |= {(d["metadata"].get("namespace", ns), d["metadata"]["name"])
                        for d in docs if d["kind"] == "Secret"}
    for doc in docs:
        meta = doc.get("metadata", {})
        if doc["kind"] not in CLUSTER_KINDS:
            cluster.need_namespace(meta.get("namespace", ns), f"{where} (rendered {doc['kind']})")
        if doc["kind"] == "Service":
            cluster.services.add((meta.get("namespace", ns), meta["name"]))
        if doc["kind"] == "Deployment" and meta["name"].endswith("-operator"):
            container = doc["spec"]["template"]["spec"]["containers"][0]
            cluster.image = container["image"]
            cli = container.get("args", [])
            cluster.all_namespaces = "--all-namespaces" in cli
            cluster.watched = {a.split("=", 1)[1] for a in cli if a.startswith("--namespaces=")}
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                for env in container.get("env", []):
                    ref = env.get("valueFrom", {}).get("secretKeyRef")
                    if ref and args[1] == "install" and cluster.secrets:
                        assert (ns, ref["name"]) in cluster.secrets, (
                            f"{where}: {meta['name']} reads Secret {ref['name']!r} in {ns}, "
                            "which the docs never create")


def kubectl(cluster: Cluster, args: list[str], where: str, first_doc: bool) -> None:
    ns = namespace_of(args)
    verb = next(a for a in args[1:] if not a.startswith("-") and a != ns)
    if verb == "create" and args[args.index("create") + 1] == "namespace":
        cluster.namespaces.add(args[args.index("create") + 2])
        return
    if ns is not None and "-A" not in args:
        cluster.need_namespace(ns, where)
    if verb == "create" and args[args.index("create") + 1] == "secret":
        cluster.secrets.add((ns or "default", args[args.index("create") + 3]))
    if verb == "port-forward":
        target = next(a for a in args if a.startswith("svc/"))
        assert (ns, target[4:]) in cluster.services, f"{where}: no Service {target} in {ns}"
    for path in files_of(args):
        assert path.exists(), f"{where}: {path.relative_to(ROOT)} does not exist"
        if verb != "apply":
            continue
        for doc in manifests(path):
            if doc["kind"] in CLUSTER_KINDS:
                continue
            doc_ns = doc["metadata"].get("namespace", ns or "default")
            cluster.need_namespace(doc_ns, f"{where} ({path.name})")
            if doc["kind"] == "Secret":
                cluster.secrets.add((doc_ns, doc["metadata"]["name"]))
            if doc["kind"] == "AgentRunPool":
                check_pool(cluster, doc, doc_ns, f"{where} ({path.name})", first_doc)


def check_pool(cluster: Cluster, pool: dict[str, Any], ns: str, where: str,
               first_doc: bool) -> None:
    assert cluster.all_namespaces or ns in cluster.watched, (
        f"{where}: pool in {ns!r}, but the operator installed watches {sorted(cluster.watched)}")
    secret = pool["spec"]["database"]["secretKeyRef"]["name"]
    assert (ns, secret) in cluster.secrets, f"{where}: Secret {secret!r} not created in {ns}"
    if first_doc:  # the first pool a reader applies is one that runs as it is
        assert pool["spec"]["agent"].startswith("runlease.agents."), where
        assert pool["spec"]["image"] == cluster.image, (
            f"{where}: image {pool['spec']['image']} is not the installed {cluster.image}")


def runlease_command(args: list[str], where: str) -> None:
    words = [a for a in args[1:] if not a.startswith("-")][:2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    for n in (2, 1):
        result = subprocess.run([sys.executable, "-P", "-m", "runlease", *words[:n], "--help"],
                                env=env, capture_output=True, text=True, timeout=60,
                                check=False)
        if result.returncode == 0 and "Commands:" not in result.stdout:
            break
    else:
        pytest.fail(f"{where}: `runlease {' '.join(words)}` is not a command")
    for option in (a.split("=", 1)[0] for a in args if a.startswith("--")):
        assert option in result.stdout, f"{where}: runlease {' '.join(words)} has no {option}"


def check_block(cluster: Cluster, block: Block, first_doc: bool) -> None:
    for command in block.commands():
        args = shlex.split(command.rstrip("&").strip())
        while args and re.fullmatch(r"[A-Z_]+=.*", args[0]):
            args = args[1:]
        where = f"{block.where}: {command[:60]}"
        if args[0] == "helm" and args[1] in ("install", "upgrade"):
            helm_release(cluster, args, where)
        elif args[0] == "kubectl":
            kubectl(cluster, args, where, first_doc)
        elif args[0] == "runlease":
            runlease_command(args, where)


def test_the_cluster_commands_of_the_docs_hold_against_the_chart(helm: Helm) -> None:
    blocks = command_blocks("cluster")
    first = [b for b in blocks if b.path.name == "installation.md"]
    assert first, "installation.md has no cluster blocks"
    cluster = Cluster(helm)
    for block in first:
        check_block(cluster, block, first_doc=True)
    assert cluster.image is not None, "installation.md installs no release"
    for block in (b for b in blocks if b.path.name != "installation.md"):
        check_block(cluster, block, first_doc=False)


def test_notes_name_examples_that_exist_and_agree(helm: Helm) -> None:
    notes = helm.run("install", "runlease", str(ROOT / "charts" / "runlease"), "-n", "runlease",
                     "--dry-run=client", "--set", "operator.watchNamespaces={agents}").stdout
    notes = notes[notes.index("NOTES:"):]
    named = set(re.findall(r"examples/[a-z-]+\.yaml", notes))
    assert "examples/quickstart-pool.yaml" in named
    for path in named:
        docs = manifests(ROOT / path)
        assert docs, path
        # The NOTES say these live in "agents", the namespace installation.md creates.
        assert all(d["metadata"]["namespace"] == "agents" for d in docs), path
        assert '"agents"' in notes
