"""Named SQL statements, loaded once from `sql/*.sql`.

A file holds statements headed by `-- name: <entity>_<verb>`; the text up to
the next header is the statement. A `-- part: <name>` header holds a piece of
SQL that several statements share (parts.sql): a statement says `{{name}}`
where the part's text goes, so the sent SQL spells it out. functions.sql and
migrations/ are not statements and are read by `migrate` instead.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import LiteralString

_HEADER = re.compile(r"^-- (name|part): ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_USE = re.compile(r"\{\{([a-z][a-z0-9_]*)\}\}")
_NOT_STATEMENTS = frozenset({"functions.sql"})


def _sections(text: str, source: str) -> dict[str, dict[str, str]]:
    """{"name": {name: statement}, "part": {name: text}} of one .sql file."""
    out: dict[str, dict[str, str]] = {"name": {}, "part": {}}
    parts = _HEADER.split(text)
    # parts = [preamble, kind1, name1, body1, kind2, name2, body2, ...]
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        # Whole-line comments stay in the files, not in what is sent: psycopg
        # caches the parsing of statements up to 4 KiB only, so a long
        # commented statement would be re-parsed at every call.
        code = "\n".join(line for line in body.splitlines()
                         if not line.lstrip().startswith("--"))
        statement = code.strip().rstrip(";").strip()
        if not statement:
            raise ValueError(f"{source}: {kind} {name!r} is empty")
        if name in out[kind]:
            raise ValueError(f"{source}: {kind} {name!r} is defined twice")
        out[kind][name] = statement
    return out


def parse(text: str, source: str) -> dict[str, str]:
    """Split one .sql file into {name: statement} (its parts not filled in)."""
    return _sections(text, source)["name"]


def fill(statement: str, parts: dict[str, str], name: str, _within: tuple[str, ...] = ()) -> str:
    """The statement with each `{{part}}` replaced by the part's text (its
    own parts filled in too)."""
    def part(use: re.Match[str]) -> str:
        if use[1] not in parts:
            raise ValueError(f"statement {name!r} uses the unknown part {use[1]!r}")
        if use[1] in _within:
            raise ValueError(f"part {use[1]!r} uses itself (in statement {name!r})")
        return fill(parts[use[1]], parts, name, (*_within, use[1]))
    return _USE.sub(part, statement)


@cache
def statements() -> MappingProxyType[str, str]:
    found: dict[str, str] = {}
    parts: dict[str, str] = {}
    for entry in sorted(resources.files("runlease.db").joinpath("sql").iterdir(),
                        key=lambda e: e.name):
        if not entry.name.endswith(".sql") or entry.name in _NOT_STATEMENTS:
            continue
        sections = _sections(entry.read_text(encoding="utf-8"), entry.name)
        for kind, into in (("name", found), ("part", parts)):
            for name, text in sections[kind].items():
                if name in into:
                    raise ValueError(f"{kind} {name!r} is defined in two files")
                into[name] = text
    return MappingProxyType({name: fill(text, parts, name) for name, text in found.items()})


def sql(name: str) -> LiteralString:
    """The text of one named statement. The texts are our own files, never
    user input, which is what LiteralString promises psycopg."""
    return statements()[name]
