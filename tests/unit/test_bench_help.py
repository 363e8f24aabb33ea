"""Every bench/ script answers --help with `.[bench]` alone, as
docs/benchmarks.md says: without pytest (bench/chaos.py and bench/console.py
used to import it through the test fixtures)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.proc import ROOT

SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py")
                 if '__name__ == "__main__"' in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_help_works_without_pytest(script: Path, tmp_path: Path) -> None:
    for hidden in ("pytest", "_pytest"):  # shadowed: importing them fails, as uninstalled
        (tmp_path / f"{hidden}.py").write_text(f"raise ImportError('no {hidden} here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}
    result = subprocess.run([sys.executable, str(script), "--help"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
