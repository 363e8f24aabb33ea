"""The openai agent needs the `openai` extra: without it, naming the agent
fails in one line that says what to install, and runlease itself still imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# `sys.modules["openai"] = None` makes `import openai` fail as if it were not
# installed; a fresh interpreter keeps that from the other tests.
WITHOUT_OPENAI = """
import sys
sys.modules["openai"] = None
import runlease, runlease.worker, runlease.agents, runlease.cli
from runlease.errors import SettingsError
from runlease.settings.worker import load_agent
try:
    load_agent("runlease.agents.openai:agent")
except SettingsError as exc:
    print(exc)
"""


def test_without_the_package_the_agent_fails_in_one_clear_line() -> None:
    out = subprocess.run([sys.executable, "-c", WITHOUT_OPENAI], capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(SRC)}).stdout
    (line,) = out.splitlines()
    assert "pip install 'runlease[openai]'" in line
    assert "runlease.agents.openai" in line
