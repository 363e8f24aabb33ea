"""The Dockerfile, read as instructions, and scripts/check-image, the
fallback of scripts/build-image where no image builder exists (it does what
the Dockerfile does in a virtualenv). The image itself, built and run, is
tests/image's."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.image.engine import configured

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CHECK_IMAGE = ROOT / "scripts" / "check-image"
WHEEL_COMMAND = "python -m pip wheel --no-deps -w /dist ."
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|make|cc|libc6-dev|python3-dev)\b")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions: comments dropped, continuation lines joined."""
    out: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def stages(text: str) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for ins in instructions(text):
        if ins.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


STAGES = stages(DOCKERFILE.read_text())
FINAL = STAGES[-1]


def last(stage: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert found, f"the final stage has no {keyword}"
    return found[-1]


def test_multi_stage_build_then_runtime() -> None:
    assert len(STAGES) >= 2
    froms = [s[0].args for s in STAGES]
    assert all(f.startswith(("${PYTHON_IMAGE}", "python:3.11-slim")) for f in froms), froms
    arg = [i.args for i in instructions(DOCKERFILE.read_text()) if i.keyword == "ARG"]
    assert "PYTHON_IMAGE=python:3.11-slim" in arg
    build = STAGES[0]
    assert any(i.keyword == "RUN" and i.args == WHEEL_COMMAND for i in build), (
        f"the build stage must run `{WHEEL_COMMAND}`")
    # The runtime stage installs that wheel into a virtualenv.
    runs = " ".join(i.args for i in FINAL if i.keyword == "RUN")
    assert "from=build" in runs
    assert "/dist" in runs
    assert "-m venv" in runs
    assert re.search(r'pip"? install .*/dist/\*\.whl', runs), runs


def test_the_final_stage_runs_as_a_numeric_non_root_user() -> None:
    user = last(FINAL, "USER").args
    uid = user.split(":")[0]
    assert uid not in {"0", "root"}
    assert uid.isdigit(), "Kubernetes' runAsNonRoot can verify only a numeric USER"
    assert uid == "10001"


def test_entrypoint_and_cmd() -> None:
    assert json.loads(last(FINAL, "ENTRYPOINT").args) == ["runlease"]
    assert json.loads(last(FINAL, "CMD").args) == ["--help"]
    labels = " ".join(i.args for i in FINAL if i.keyword == "LABEL")
    for key in ("org.opencontainers.image.title", "org.opencontainers.image.version",
                "org.opencontainers.image.licenses"):
        assert key in labels


def test_no_compiler_in_the_final_stage() -> None:
    for ins in FINAL:
        if ins.keyword == "RUN":
            assert not COMPILERS.search(ins.args), f"a compiler in the final stage: {ins.args}"
            assert "apt-get install" not in ins.args or "--no-install-recommends" in ins.args


def test_the_parser_sees_what_it_should() -> None:
    bad = stages("FROM a AS build\nRUN x\nFROM b\nRUN apt-get install -y \\\n  gcc\n"
                 "USER root\n")
    assert len(bad) == 2
    assert COMPILERS.search(last(bad[-1], "RUN").args)
    assert last(bad[-1], "USER").args == "root"


def test_the_build_context_is_only_the_sources() -> None:
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*"  # everything out first: a later "*" would undo the re-includes
    assert {"!pyproject.toml", "!README.md", "!src/"} <= set(ignore)
    copies = [i.args for s in STAGES for i in s if i.keyword == "COPY" and "--from" not in i.args]
    sources = {word for c in copies for word in c.split()[:-1]}
    assert sources == {"pyproject.toml", "README.md", "src"}


def test_check_image_builds_the_wheel_the_same_way() -> None:
    script = CHECK_IMAGE.read_text()
    assert '-m pip wheel' in script
    assert "--no-deps -w" in script
    assert "-m venv" in script
    assert "runlease $cmd --help" in script
    assert '"" worker' in script


@pytest.mark.slow
@pytest.mark.skipif("RUNLEASE_IMAGE" in configured(),
                    reason="an image is built (scripts/build-image): tests/image runs it instead")
def test_check_image(tmp_path: Path) -> None:
    """The wheel, installed with its dependencies into a clean virtualenv,
    starts: what `docker build` and `docker run IMAGE worker --help` would
    show, where no builder can build the image itself."""
    result = subprocess.run(["bash", str(CHECK_IMAGE)], capture_output=True, text=True,
                            timeout=900, check=False,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("runlease --help: ok", "runlease worker --help: ok", "check-image: ok"):
        assert line in result.stdout, result.stdout

