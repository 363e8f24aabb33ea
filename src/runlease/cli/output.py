"""How API commands print what they got, after kubectl's `get`.

`-o table` (the default): plain columns padded with spaces, an upper-case
header, nothing cut, no colour and no box drawing, so a line is one row
whatever the terminal's width and `runlease runs list | grep dead` finds the
dead runs. `-o wide` adds columns. `-o json` / `-o yaml`: the API's objects,
times in RFC 3339 as the API sends them. `-o name`: one id (or pool name) a
line, for `xargs`. `--no-headers` drops the header line of a table.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import click
import yaml

FORMATS = ("table", "wide", "json", "yaml", "name")
GAP = "   "  # between columns, as kubectl's


@dataclass
class Settings:
    """The output options of the command being run (one command a process)."""

    format: str = "table"
    headers: bool = True


current = Settings()


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[Any], object]
    wide: bool = False  # only under -o wide


def cell(value: object) -> str:
    """One value as a table shows it: times in RFC 3339, none as `<none>`."""
    if value is None or value == "":
        return "<none>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    # One row a line: a value's own line breaks or control characters would
    # split it or drive the terminal.
    return "".join(c if c.isprintable() else "?" for c in str(value))


def iso(at: datetime) -> str:
    """RFC 3339 in UTC with `Z`, as the API writes its times."""
    if at.tzinfo is None:
        return at.isoformat()
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def age(at: datetime, now: datetime | None = None) -> str:
    """How long ago, as kubectl's AGE column: 42s, 7m, 5h, 3d."""
    return _span(int(((now or datetime.now(UTC)) - at).total_seconds()))


def until(at: datetime, now: datetime | None = None) -> str:
    """How long from now: in 42s, in 7h (`now` when it is past)."""
    seconds = int((at - (now or datetime.now(UTC))).total_seconds())
    return f"in {_span(seconds)}" if seconds > 0 else "now"


def _span(seconds: int) -> str:
    seconds = max(0, seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def render(items: Sequence[Any], columns: Sequence[Column], *, wide: bool | None = None,
           headers: bool | None = None) -> str:
    """The table's text, each column as wide as its widest cell."""
    wide = current.format == "wide" if wide is None else wide
    headers = current.headers if headers is None else headers
    shown = [c for c in columns if wide or not c.wide]
    rows = [[cell(c.value(item)) for c in shown] for item in items]
    if headers:
        rows.insert(0, [c.header for c in shown])
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows) for i in range(len(shown))]
    return "\n".join(GAP.join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def table(items: Sequence[Any], columns: Sequence[Column]) -> None:
    text = render(items, columns)
    if text:
        click.echo(text)


def count(n: int, noun: str) -> str:
    """`1 run`, `2 runs`."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def jsonable(value: Any) -> Any:
    """Dataclasses, UUIDs and times as the API's JSON has them."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, UUID):
        return str(value)
    return value if isinstance(value, str | int | float | bool | type(None)) else str(value)


def names(value: Any) -> list[str]:
    """-o name: the ids (runs, schedules, operations) or names (pools) in value."""
    data = jsonable(value)
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        data = data["items"]
    if isinstance(data, dict) and isinstance(data.get("ids"), list):
        return [str(i) for i in data["ids"]]
    found = []
    for item in data if isinstance(data, list) else [data]:
        if isinstance(item, dict):
            key = item.get("id", item.get("name", item.get("key")))
            if key is not None:
                found.append(str(key))
        elif isinstance(item, str):
            found.append(item)
    return found


def emit(value: Any) -> None:
    """Print value as -o json, yaml or name asks (json for anything else)."""
    if current.format == "name":
        for name in names(value):
            click.echo(name)
    elif current.format == "yaml":
        click.echo(yaml.safe_dump(jsonable(value), sort_keys=False, allow_unicode=True)
                   .rstrip("\n"))
    else:
        click.echo(json.dumps(jsonable(value), indent=2))
