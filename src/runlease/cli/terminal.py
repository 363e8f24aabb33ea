"""What every API command of the `runlease` CLI shares: the --api-url, --token
and output options, a client whose errors end the command in one line, and
output as tables (rich) for humans or `--json` for scripts.

The API URL and token come from options or RUNLEASE_API_URL / RUNLEASE_TOKEN.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from runlease.client import ApiError, Client, RunPage, RunView, StepPage

F = TypeVar("F", bound=Callable[..., Any])
console = Console()


def out(*objects: Any) -> None:
    """Print to the console of this command (a full-width one under --wide)."""
    console.print(*objects)


def api_options(command: F) -> F:
    """--api-url, --token and the output format (`-o json` = --json, `-o wide` =
    --wide) for a command written as f(api_url, token, as_json, ...)."""

    @functools.wraps(command)
    def formatted(*args: Any, output: str | None, wide: bool, **kwargs: Any) -> Any:
        global console
        if output == "json":
            kwargs["as_json"] = True
        if not (wide or output == "wide"):
            return command(*args, **kwargs)
        # Nothing cut to the terminal's width (or to 80 columns in a pipe).
        usual, console = console, Console(width=100_000)
        try:
            return command(*args, **kwargs)
        finally:
            console = usual

    wrapped: Any = formatted
    wrapped = click.option("--wide", is_flag=True,
                           help="Tables at full width, nothing cut.")(wrapped)
    wrapped = click.option("-o", "--output", type=click.Choice(["table", "wide", "json"]),
                           help="Output format (table is the default).")(wrapped)
    wrapped = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON instead of a table (= -o json).")(wrapped)
    wrapped = click.option("--token", envvar="RUNLEASE_TOKEN", required=True,
                           help="Bearer token [env: RUNLEASE_TOKEN].")(wrapped)
    return click.option("--api-url", envvar="RUNLEASE_API_URL",  # type: ignore[no-any-return]
                        default="http://127.0.0.1:8080", show_default=True,
                        help="[env: RUNLEASE_API_URL]")(wrapped)


@contextmanager
def client(api_url: str, token: str) -> Iterator[Client]:
    try:
        with Client(api_url, token) as api:
            yield api
    except ApiError as exc:
        where = f" ({exc.field})" if exc.field else ""
        click.echo(f"error: {exc.status} {exc.code}{where}: {exc.message}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"error: cannot reach {api_url}: {exc}", err=True)
        sys.exit(1)


def jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return value if isinstance(value, str | int | float | bool | type(None)) else str(value)


def emit_json(value: Any) -> None:
    click.echo(json.dumps(jsonable(value), indent=2))


def page_out(page: RunPage | StepPage, as_json: bool, table: Callable[[Any], Table]) -> None:
    """A page: as JSON, or as a table and how to ask for the next one."""
    if as_json:
        emit_json(page)
        return
    out(table(page.items))
    if page.next_cursor:
        out(f"more: --cursor {page.next_cursor}")


def runs_table(runs: list[RunView], title: str | None = None) -> Table:
    table = Table(title=title)
    # Whole ids at any width: an id is for copying into the next command.
    table.add_column("id", no_wrap=True, min_width=36)
    for column in ("tenant", "pool", "status", "attempts", "error", "created"):
        table.add_column(column)
    colors = {"done": "green", "dead": "red", "cancelled": "yellow", "leased": "cyan"}
    for run in runs:
        status = f"[{colors.get(run.status, 'white')}]{run.status}[/]"
        table.add_row(str(run.id), run.tenant_id, run.pool, status,
                      f"{run.attempts}/{run.max_attempts}", run.error_code or "",
                      run.created_at.strftime("%H:%M:%S"))
    return table
