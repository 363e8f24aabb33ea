"""Every command block of the docs is run, checked against the chart, or
skipped with a reason: none is left unchecked by accident."""

from __future__ import annotations

from tests.docs.blocks import KINDS, command_blocks


def test_every_command_block_says_how_it_is_tested() -> None:
    problems = []
    for block in command_blocks():
        if block.kind is None:
            problems.append(f"{block.where}: no <!-- doc-test: ... --> marker")
        elif block.kind not in KINDS:
            problems.append(f"{block.where}: unknown marker {block.kind!r}")
        elif block.kind == "skip" and not block.reason:
            problems.append(f"{block.where}: a skip needs a reason")
    assert not problems, "\n".join(problems)


def test_there_are_blocks_of_each_kind() -> None:
    kinds = {b.kind for b in command_blocks()}
    assert {"dev", "dev-server", "cluster"} <= kinds


def test_every_python_block_compiles() -> None:
    for block in command_blocks():
        if block.lang == "python":
            compile(block.text, block.where, "exec")
