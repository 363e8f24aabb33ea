"""What every API command of the `runlease` CLI shares: the --api-url, --token
and output options, a client whose errors end the command in one line (the
URL named when it cannot be reached), and output as cli/output.py prints it.

The API URL and token come from options or RUNLEASE_API_URL / RUNLEASE_TOKEN.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
import httpx
from rich.console import Console

from runlease.cli import output as printing
from runlease.client import ApiError, Client, RunPage, RunView, SchedulePage, StepPage

F = TypeVar("F", bound=Callable[..., Any])
console = Console()


def out(*objects: Any) -> None:
    """Print a message (rich markup) to the console of this command."""
    console.print(*objects)


def api_options(command: F) -> F:
    """--api-url, --token and the output options (cli/output.py) for a
    command written as f(api_url, token, as_json, ...): `as_json` is true for
    -o json, yaml and name, which the command prints through emit_json."""

    @functools.wraps(command)
    def formatted(*args: Any, output: str | None, wide: bool, no_headers: bool,
                  **kwargs: Any) -> Any:
        if kwargs.get("as_json"):
            output = output or "json"
        if wide and output in (None, "table"):
            output = "wide"
        printing.current = printing.Settings(output or "table", headers=not no_headers)
        kwargs["as_json"] = printing.current.format in ("json", "yaml", "name")
        return command(*args, **kwargs)

    wrapped: Any = formatted
    wrapped = click.option("--no-headers", is_flag=True,
                           help="Tables without their header line.")(wrapped)
    wrapped = click.option("--wide", is_flag=True, help="= -o wide.")(wrapped)
    wrapped = click.option("-o", "--output", type=click.Choice(printing.FORMATS),
                           help="table (the default), wide (more columns), json, yaml, "
                                "or name (one id a line).")(wrapped)
    wrapped = click.option("--json", "as_json", is_flag=True, help="= -o json.")(wrapped)
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
    except (OSError, httpx.TransportError) as exc:
        click.echo(f"error: cannot reach the API at {api_url} ({type(exc).__name__}: {exc}); "
                   "is it running? (--api-url, RUNLEASE_API_URL)", err=True)
        sys.exit(1)


jsonable = printing.jsonable


def label_filters(items: tuple[str, ...]) -> list[str]:
    """--label filters: `key=value` as kubectl's selectors (`key:value`,
    the API's older spelling, is accepted too)."""
    for item in items:
        if "=" not in item and ":" not in item:
            raise click.BadParameter(f"{item!r}: give key=value", param_hint="--label")
    return list(items)


_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?"
                   r"[0-9a-fA-F]{12}$")


def run_id(api: Client, given: str) -> str:
    """A run id, or a unique start of one (at least 8 hex digits), as git and
    docker take a short id; the whole id, or an error that ends the command."""
    if _UUID.match(given):
        return given
    if len(given.replace("-", "")) < 8 or not re.fullmatch(r"[0-9a-fA-F-]{8,36}", given):
        raise click.BadParameter(f"{given!r}: a run id, or at least its first 8 hex digits",
                                 param_hint="RUN_ID")
    found = api.list(id_prefix=given, limit=2).items
    if not found:
        click.echo(f"error: no run of yours has an id starting with {given}", err=True)
        sys.exit(1)
    if len(found) > 1:
        click.echo(f"error: {given} starts the ids of several runs ({found[0].id}, "
                   f"{found[1].id}, ...); give more of it", err=True)
        sys.exit(1)
    return str(found[0].id)


def emit_json(value: Any) -> None:
    """value as -o json, yaml or name asks."""
    printing.emit(value)


def page_out(page: RunPage | StepPage | SchedulePage, as_json: bool,
             table: Callable[[Any], None], cursor: Callable[[str], str] = str) -> None:
    """A page: as -o asks, or as a table and how to ask for the next one (its
    cursor written by `cursor`, on stderr so that a pipe gets rows only)."""
    if as_json:
        emit_json(page)
        return
    table(page.items)
    if page.next_cursor:
        click.echo(f"more: --cursor {cursor(page.next_cursor)}", err=True)


def _attempts(run: RunView) -> str:
    return f"{run.attempts}/{run.max_attempts}"


RUN_COLUMNS = (
    printing.Column("ID", lambda r: r.id),
    printing.Column("STATUS", lambda r: r.status),
    printing.Column("POOL", lambda r: r.pool),
    printing.Column("ATTEMPTS", _attempts),
    printing.Column("AGE", lambda r: printing.age(r.created_at)),
    printing.Column("PRIORITY", lambda r: r.priority, wide=True),
    printing.Column("ERROR", lambda r: r.error_code, wide=True),
    printing.Column("LABELS", lambda r: ",".join(f"{k}={v}" for k, v in
                                                 (r.labels or {}).items()), wide=True),
    # Before CREATED: a title has spaces, and CREATED stays the last word of a row.
    printing.Column("TITLE", lambda r: r.title, wide=True),
    printing.Column("CREATED", lambda r: r.created_at, wide=True),
)
TENANT = printing.Column("TENANT", lambda r: r.tenant_id)


def runs_table(runs: list[RunView]) -> None:
    """Runs as kubectl prints pods: whole ids (for copying into the next
    command), fitting 80 columns; TENANT only when the rows span tenants, as
    kubectl adds NAMESPACE under --all-namespaces."""
    columns = list(RUN_COLUMNS)
    if len({r.tenant_id for r in runs}) > 1 or printing.current.format == "wide":
        columns.insert(1, TENANT)
    printing.table(runs, columns)
