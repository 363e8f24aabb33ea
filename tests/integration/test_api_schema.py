"""schemathesis, every check (positive-data acceptance and negative-data
rejection included), against `runlease api` as its own process, with a
tenant's token and with admin's: the OpenAPI document says exactly what the
server accepts, and no request answers 5xx.

Bounded in time (one `--max-time` per token) so the suite stays short; the
event stream is left out (a stream of a run that never finishes stays open by
design; its malformed inputs have their own tests in test_api_edges.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.api import ADMIN_TOKEN, TOKENS
from tests.support.api_process import ApiProcess
from tests.support.proc import ROOT

pytestmark = pytest.mark.slow

MAX_TIME_S = 25  # per token: with start-up, the two together take 60-90 s


@pytest.fixture
def api_process(db_url: str, tmp_path: Path) -> Iterator[ApiProcess]:
    api = ApiProcess(db_url, tmp_path).start()
    try:
        yield api
    finally:
        api.cleanup()


@pytest.mark.parametrize("who", ["acme", "admin"])
def test_schemathesis_all_checks(api_process: ApiProcess, tmp_path: Path, who: str) -> None:
    binary = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert binary, "schemathesis is a dev dependency: pip install -e '.[dev]'"
    token = ADMIN_TOKEN if who == "admin" else TOKENS[who]
    proc = subprocess.run(
        [binary, "run", f"{api_process.url}/openapi.json",
         "--header", f"Authorization: Bearer {token}",
         "--checks", "all",
         "--exclude-path", "/v1/runs/{run_id}/events",
         "--phases", "examples,coverage,fuzzing",
         "--max-examples", "20", "--max-time", str(MAX_TIME_S), "--seed", "2026",
         "--request-timeout", "10", "--workers", "1", "--no-color",
         "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=MAX_TIME_S * 4, cwd=tmp_path, check=False,
        env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.support.schemathesis_hooks",
             "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])},
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-8000:]
