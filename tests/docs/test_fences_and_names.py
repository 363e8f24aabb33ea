"""The docs render as written and their examples stand on what the docs
make: every code block is closed (an unclosed one turned a heading of
docs/api.md into code), and every pool an example uses is `default` or one
that some page of the docs creates (an example with a pool nobody made
answers `unknown_pool` to a reader who pastes it)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.docs.blocks import DOCS, ROOT, blocks, fence_problems

# Where an example names a pool it uses.
USES = (re.compile(r'"pool":\s*"([a-z0-9][a-z0-9_.-]*)"'),
        re.compile(r"--pool[ =]([a-z0-9][a-z0-9_.-]*)"),
        re.compile(r"[?&]pool=([a-z0-9][a-z0-9_.-]*)"))
# Where the docs make one for every page: through the CLI or the HTTP API.
MAKES = (re.compile(r"runlease pools (?:set|upsert) ([a-z0-9][a-z0-9_.-]*)"),
         re.compile(r"PUT \S*/v1/pools/([a-z0-9][a-z0-9_.-]*)"))
# An AgentRunPool makes one for the examples of its own page (a cluster's).
MAKES_HERE = re.compile(r"kind: AgentRunPool\s+metadata:\s*\{?\s*name:\s*([a-z0-9][a-z0-9-]*)")
# Named on purpose to show the answer to a pool that does not exist.
MISSING_ON_PURPOSE = frozenset({"nowhere"})
CODE_LANGS = frozenset({"sh", "bash", "shell", "console", "python", "json", "yaml", "http"})


def test_every_code_block_is_closed() -> None:
    problems = [p for path in DOCS for p in fence_problems(path)]
    assert not problems, "\n".join(problems)


def pools_made() -> set[str]:
    made = {"default"}
    for path in DOCS:
        for pattern in MAKES:
            made |= set(pattern.findall(path.read_text(encoding="utf-8")))
    return made


def made_on_page(path: Path) -> set[str]:
    """The pools the page's own AgentRunPools make, written out or applied
    from examples/ (`kubectl apply -f examples/x.yaml`)."""
    text = path.read_text(encoding="utf-8")
    made = set(MAKES_HERE.findall(text))
    for applied in re.findall(r"kubectl apply -f (examples/\S+\.ya?ml)", text):
        for doc in yaml.safe_load_all((ROOT / applied).read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "AgentRunPool":
                made.add(doc["metadata"]["name"])
    return made


def test_every_pool_an_example_uses_is_made_somewhere_in_the_docs() -> None:
    made = pools_made() | MISSING_ON_PURPOSE
    problems = []
    for block in blocks():
        if block.lang not in CODE_LANGS:
            continue
        here = made_on_page(block.path)
        for pattern in USES:
            for pool in pattern.findall(block.text):
                if pool not in made | here:
                    problems.append(f"{block.where}: pool {pool!r} is used, but no page of "
                                    "the docs creates it")
    assert not problems, "\n".join(sorted(set(problems)))


def orphan_table_rows(path: Path) -> list[str]:
    """Table rows that start a table without a header and its `|---|` line:
    what is left of a table that a paragraph split in two (Markdown renders
    them as text)."""
    problems = []
    lines = path.read_text(encoding="utf-8").splitlines()
    in_code = False
    for n, line in enumerate(lines):
        if line.startswith("```"):
            # A fence with a language always opens (as fence_problems reads it).
            in_code = not (in_code and line.strip() == "```")
            continue
        starts = line.startswith("|") and (n == 0 or not lines[n - 1].startswith("|"))
        if in_code or not starts:
            continue
        following = lines[n + 1] if n + 1 < len(lines) else ""
        if not re.match(r"^\|\s*:?-{3,}", following):
            problems.append(f"{path.relative_to(ROOT)}:{n + 1}: table rows without a header "
                            "(a table split by a paragraph?)")
    return problems


def test_no_table_is_split_by_a_paragraph() -> None:
    problems = [p for path in DOCS for p in orphan_table_rows(path)]
    assert not problems, "\n".join(problems)
