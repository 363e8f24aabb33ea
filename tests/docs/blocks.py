"""The command blocks of README.md and docs/*.md, and what each needs.

Every ```sh and ```python block is preceded by a marker comment:

    <!-- doc-test: dev -->            run against `runlease dev` (tests/docs/test_dev.py)
    <!-- doc-test: dev-server -->     the command that starts that `runlease dev`
    <!-- doc-test: cluster -->        needs a cluster: checked against `helm template` and
                                      the manifests it applies (tests/chart/test_docs_cluster.py)
    <!-- doc-test: skip REASON -->    not run, for the reason given

A block without one fails tests/docs/test_marked.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_LANGS = frozenset({"sh", "bash", "shell", "console", "python"})
KINDS = frozenset({"dev", "dev-server", "cluster", "skip"})

_FENCE = re.compile(r"^```([A-Za-z]*)\s*$")
_MARKER = re.compile(r"^<!-- doc-test: ([a-z-]+)(?: (.*?))? -->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    kind: str | None
    reason: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[str]:
        """Logical shell commands: continuation lines joined, comments and
        blank lines dropped, a trailing comment removed."""
        out: list[str] = []
        pending = ""
        for raw in self.text.splitlines():
            line = raw.rstrip()
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            out.append(strip_comment(pending + line).strip())
            pending = ""
        return [c for c in out if c]


def strip_comment(command: str) -> str:
    """The command without a trailing `# ...` comment (outside quotes)."""
    quote = None
    for i, ch in enumerate(command):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i]
    return command


def blocks(paths: list[Path] | None = None) -> list[Block]:
    found: list[Block] = []
    for path in paths or DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            lang, start = m.group(1).lower(), i
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            marker = None
            k = start - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            if k >= 0:
                marker = _MARKER.match(lines[k].strip())
            found.append(Block(path, start + 1, lang, "\n".join(lines[start + 1:j]),
                               marker.group(1) if marker else None,
                               marker.group(2) if marker else None))
            i = j + 1
    return found


def command_blocks(kind: str | None = None) -> list[Block]:
    return [b for b in blocks() if b.lang in COMMAND_LANGS and (kind is None or b.kind == kind)]


def fence_problems(path: Path) -> list[str]:
    """Code blocks that are not closed: an opening fence (one with a
    language) where the open block's closing one should be, or a block still
    open at the end. Markdown then renders the prose after it as code (a
    heading included), and blocks() pairs the wrong fences."""
    problems = []
    opened: int | None = None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.startswith("```"):
            continue
        if opened is None:
            opened = n
        elif line.strip() != "```":
            problems.append(f"{path.relative_to(ROOT)}:{opened}: a block not closed before "
                            f"line {n} ({line.strip()!r} opens another)")
            opened = n
        else:
            opened = None
    if opened is not None:
        problems.append(f"{path.relative_to(ROOT)}:{opened}: a block not closed by the end")
    return problems
