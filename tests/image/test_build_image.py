"""scripts/build-image's failures: CI must fail when no image is built."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.image.engine import ENV_FILE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-image"
BUILDERS = {"docker", "buildah", "podman", "apt-get"}


def _path_without_builders(tmp_path: Path) -> str:
    """A PATH holding every command of this one but the builders and apt-get
    (so nothing can be installed either)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            target = bin_dir / entry.name
            if entry.name not in BUILDERS and not target.exists():
                target.symlink_to(entry.path)
    return str(bin_dir)


def test_without_a_builder_ci_fails_and_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _path_without_builders(tmp_path), "CI": "true"}
    env.pop("BUILDER", None)
    result = subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env,
                            timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "no image builder" in result.stderr
    assert "CI needs the image" in result.stderr


@pytest.mark.skipif(not (shutil.which("buildah") or shutil.which("podman")),
                    reason="needs buildah or podman")
def test_a_failed_build_fails_and_records_no_image() -> None:
    before = ENV_FILE.read_text() if ENV_FILE.exists() else None
    # A base no registry holds: the build fails at its first FROM.
    env = {**os.environ, "PYTHON_IMAGE": "localhost/runlease-no-such-base:0"}
    env.pop("BUILDER", None)
    result = subprocess.run([str(SCRIPT), "localhost/runlease-build-must-fail:0"],
                            capture_output=True, text=True, env=env, timeout=300,
                            check=False, stdin=subprocess.DEVNULL)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "built in" not in result.stderr
    assert (ENV_FILE.read_text() if ENV_FILE.exists() else None) == before
