"""Named SQL statements, loaded once from `sql/*.sql`.

A file holds statements headed by `-- name: <entity>_<verb>`; the text up to
the next header is the statement. functions.sql and migrations/ are not
statements and are read by `migrate` instead.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import LiteralString

_HEADER = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_NOT_STATEMENTS = frozenset({"functions.sql"})


def parse(text: str, source: str) -> dict[str, str]:
    """Split one .sql file into {name: statement}."""
    out: dict[str, str] = {}
    parts = _HEADER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        # Whole-line comments stay in the files, not in what is sent: psycopg
        # caches the parsing of statements up to 4 KiB only, so a long
        # commented statement would be re-parsed at every call.
        code = "\n".join(line for line in body.splitlines()
                          if not line.lstrip().startswith("--"))
        statement = code.strip().rstrip(";").strip()
        if not statement:
            raise ValueError(f"{source}: statement {name!r} is empty")
        if name in out:
            raise ValueError(f"{source}: statement {name!r} is defined twice")
        out[name] = statement
    return out


@cache
def statements() -> MappingProxyType[str, str]:
    found: dict[str, str] = {}
    for entry in sorted(resources.files("runlease.db").joinpath("sql").iterdir(),
                        key=lambda e: e.name):
        if not entry.name.endswith(".sql") or entry.name in _NOT_STATEMENTS:
            continue
        for name, text in parse(entry.read_text(encoding="utf-8"), entry.name).items():
            if name in found:
                raise ValueError(f"statement {name!r} is defined in two files")
            found[name] = text
    return MappingProxyType(found)


def sql(name: str) -> LiteralString:
    """The text of one named statement. The texts are our own files, never
    user input, which is what LiteralString promises psycopg."""
    return statements()[name]
