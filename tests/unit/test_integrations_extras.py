"""The library adapters are extras: without the library, runlease and its
worker, CLI and dev stack still import, and an object of that library names
what to install in one line (a fresh interpreter keeps the hidden packages
from the other tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

WITHOUT_LIBRARIES = """
import sys
sys.modules["agents"] = None
sys.modules["pydantic_ai"] = None
import runlease, runlease.worker, runlease.agents, runlease.cli, runlease.dev
import runlease.integrations
from runlease.errors import SettingsError
from runlease.integrations import adapt
for library in ("agents", "pydantic_ai"):
    kind = type("Agent", (), {"__module__": library + ".agent"})
    try:
        adapt(kind(), "myapp:agent")
    except SettingsError as exc:
        print(exc)
"""


def test_without_the_libraries_an_agent_object_says_what_to_install() -> None:
    out = subprocess.run([sys.executable, "-c", WITHOUT_LIBRARIES], capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(SRC)}).stdout
    agents_sdk, pydantic_ai = out.splitlines()
    assert "myapp:agent" in agents_sdk
    assert "pip install 'runlease[openai-agents]'" in agents_sdk
    assert "pip install 'runlease[pydantic-ai]'" in pydantic_ai
