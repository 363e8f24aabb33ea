"""`runlease runs|dead|pools ...`: the HTTP API from a terminal.

Built on runlease.client: tables for humans (rich), `--json` for scripts.
The API URL and token come from options or RUNLEASE_API_URL / RUNLEASE_TOKEN.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from runlease.client import ApiError, Client, RunEnded, RunView, StepView, StreamEvent
from runlease.core.states import RunStatus

F = TypeVar("F", bound=Callable[..., Any])
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
console = Console()


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


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, str | int | float | bool | type(None)) else str(value)


def emit_json(value: Any) -> None:
    click.echo(json.dumps(_jsonable(value), indent=2))


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


@click.group()
def runs() -> None:
    """Submit, list, show, cancel and follow runs."""


@runs.command("submit")
@api_options
@click.option("--input", "input_json", required=True,
              help="The run input, a JSON object (or @file.json).")
@click.option("--pool")
@click.option("--priority", type=int)
@click.option("--max-attempts", type=int)
@click.option("--budget", help="A JSON object: max_turns, max_tool_calls, deadline_s.")
@click.option("--idempotency-key")
@click.option("--tenant", "tenant_id", help="Admin only: the run's tenant.")
def submit(api_url: str, token: str, as_json: bool, input_json: str, pool: str | None,
           priority: int | None, max_attempts: int | None, budget: str | None,
           idempotency_key: str | None, tenant_id: str | None) -> None:
    """Enqueue a run."""
    if input_json.startswith("@"):
        with open(input_json[1:]) as f:
            input_json = f.read()
    try:
        payload = json.loads(input_json)
        budget_obj = json.loads(budget) if budget else None
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None
    with client(api_url, token) as api:
        run = api.submit(payload, pool=pool, priority=priority, max_attempts=max_attempts,
                         budget=budget_obj, idempotency_key=idempotency_key,
                         tenant_id=tenant_id)
    if as_json:
        emit_json(run)
    else:
        console.print(f"{'submitted' if run.created else 'already submitted'}: {run.id} "
                      f"({run.status})")


@runs.command("list")
@api_options
@click.option("--status", type=click.Choice([s.value for s in RunStatus]))
@click.option("--pool")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
@click.option("--cursor")
def list_runs(api_url: str, token: str, as_json: bool, status: str | None, pool: str | None,
              limit: int, cursor: str | None) -> None:
    """Runs, newest first."""
    with client(api_url, token) as api:
        page = api.list(status=status, pool=pool, limit=limit, cursor=cursor)
    if as_json:
        emit_json(page)
        return
    console.print(runs_table(page.items))
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")


@runs.command("show")
@api_options
@click.argument("run_id")
def show(api_url: str, token: str, as_json: bool, run_id: str) -> None:
    """One run, in full."""
    with client(api_url, token) as api:
        run = api.get(run_id)
    if as_json:
        emit_json(run)
        return
    for key, value in _jsonable(run).items():
        if key != "created":
            shown = json.dumps(value) if isinstance(value, dict) else value
            console.print(f"[bold]{key}[/]: {shown}")


@runs.command("cancel")
@api_options
@click.argument("run_id")
def cancel(api_url: str, token: str, as_json: bool, run_id: str) -> None:
    """Stop a run (its tools too)."""
    with client(api_url, token) as api:
        run = api.cancel(run_id)
    if as_json:
        emit_json(run)
    else:
        state = "cancel requested" if run.status == "leased" else run.status
        console.print(f"{run.id}: {state}")


def steps_table(steps: list[StepView]) -> Table:
    table = Table()
    for column in ("step", "attempt", "committed", "result"):
        table.add_column(column, overflow="fold")
    for step in steps:
        table.add_row(step.key, str(step.attempt), step.created_at.strftime("%H:%M:%S"),
                      json.dumps(step.result)[:2000])
    return table


@runs.command("steps")
@api_options
@click.argument("run_id")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100))
@click.option("--cursor", help="Start after this step key (a page's next cursor).")
def steps(api_url: str, token: str, as_json: bool, run_id: str, limit: int,
          cursor: str | None) -> None:
    """A run's committed durable steps (what its tools returned), in key order."""
    with client(api_url, token) as api:
        page = api.steps(run_id, limit=limit, cursor=cursor)
    if as_json:
        emit_json(page)
        return
    console.print(steps_table(page.items))
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")


@runs.command("tail")
@api_options
@click.argument("run_id")
@click.option("--after", default=0, show_default=True, help="Start after this event seq.")
def tail(api_url: str, token: str, as_json: bool, run_id: str, after: int) -> None:
    """Follow a run's events until it finishes; survives dropped connections."""
    with client(api_url, token) as api:
        for item in api.events(run_id, after=after):
            if as_json:
                click.echo(json.dumps(_jsonable(item)))
            elif isinstance(item, StreamEvent) and item.kind == "tool.output" \
                    and isinstance(item.data.get("text"), str):
                # A tool's output as it printed it, not as JSON; but no
                # control characters: a run's output must not drive the terminal.
                click.echo(_CONTROL.sub("?", item.data["text"]), nl=False)
            elif isinstance(item, StreamEvent):
                console.print(f"[dim]{item.seq:>5}[/] [bold]{item.kind}[/] "
                              f"{json.dumps(item.data)}")
            elif isinstance(item, RunEnded):
                console.print(f"[bold]end[/]: {item.status}"
                              + (f" ({item.error_code})" if item.error_code else ""))


@click.group()
def dead() -> None:
    """Dead letters (admin)."""


@dead.command("list")
@api_options
@click.option("--pool")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
@click.option("--cursor")
def dead_list(api_url: str, token: str, as_json: bool, pool: str | None, limit: int,
              cursor: str | None) -> None:
    """Runs that ended dead."""
    with client(api_url, token) as api:
        page = api.dead_letters(pool=pool, limit=limit, cursor=cursor)
    if as_json:
        emit_json(page)
        return
    console.print(runs_table(page.items, "dead letters"))
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")


@dead.command("redrive")
@api_options
@click.argument("run_ids", nargs=-1, required=True)
def redrive(api_url: str, token: str, as_json: bool, run_ids: tuple[str, ...]) -> None:
    """Send dead runs back to the queue, attempts reset."""
    with client(api_url, token) as api:
        done = [api.redrive(run_id) for run_id in run_ids]
    if as_json:
        emit_json(done)
    else:
        for run in done:
            console.print(f"{run.id}: {run.status}")


@click.group()
def pools() -> None:
    """Pools and tenant limits (admin)."""


@pools.command("list")
@api_options
def pools_list(api_url: str, token: str, as_json: bool) -> None:
    with client(api_url, token) as api:
        items = api.pools()
    if as_json:
        emit_json(items)
        return
    table = Table()
    for column in ("pool", "max attempts", "lease s", "retention s", "paused", "default limit",
                   "aging s", "limits", "priority bands", "tool env"):
        table.add_column(column)
    for p in items:
        limits = ", ".join(f"{t}={n}" for t, n in p["tenant_limits"].items())
        bands = ", ".join(f"{t}={b['min']}:{b['max']}"
                          for t, b in p.get("tenant_priority", {}).items())
        default = p["default_max_in_flight"]
        table.add_row(p["name"], str(p["max_attempts"]), str(p["lease_s"]),
                      str(p.get("retention_s", "")), "yes" if p.get("paused") else "no",
                      "-" if default is None else str(default), str(p["priority_aging_s"]),
                      limits, bands, ",".join(p.get("tool_env", [])))
    console.print(table)


def _pairs(items: tuple[str, ...], option: str, parse: Callable[[str], Any]) -> dict[str, Any]:
    """TENANT=VALUE items; VALUE `none` removes the tenant's setting (None)."""
    out: dict[str, Any] = {}
    for item in items:
        tenant, sep, raw = item.rpartition("=")
        if not sep or not tenant:
            raise click.BadParameter(f"{item!r}: expected TENANT=VALUE", param_hint=option)
        try:
            out[tenant] = None if raw == "none" else parse(raw)
        except ValueError:
            raise click.BadParameter(f"{item!r}: bad value {raw!r}", param_hint=option) from None
    return out


def _band(raw: str) -> dict[str, int]:
    lo, sep, hi = raw.partition(":")
    if not sep:
        raise ValueError(raw)
    return {"min": int(lo), "max": int(hi)}


def _count(raw: str) -> int:
    if not raw.isdigit():
        raise ValueError(raw)
    return int(raw)


def _rate(raw: str) -> dict[str, int]:
    """SUBMITS/TOKENS per minute; `-` for no such rate."""
    submits, sep, tokens = raw.partition("/")
    if not sep:
        raise ValueError(raw)
    rate = {k: _count(v) for k, v in (("submits_per_minute", submits),
                                      ("tokens_per_minute", tokens)) if v != "-"}
    if not rate:
        raise ValueError(raw)
    return rate


def merge_pool(current: dict[str, Any] | None, given: dict[str, Any],
               limits: dict[str, int | None], bands: dict[str, dict[str, int] | None],
               rates: dict[str, dict[str, int] | None] | None = None) -> dict[str, Any]:
    """The PUT body: the pool as it is (or the defaults, for a new pool), with
    only what was given changed. A tenant named with `none` loses that setting."""
    body = {k: v for k, v in (current or {}).items() if k != "name"}
    body.update(given)
    for key, changes in (("tenant_limits", limits), ("tenant_priority", bands),
                         ("tenant_rates", rates or {})):
        merged = dict(body.get(key) or {})
        for tenant, value in changes.items():
            if value is None:
                merged.pop(tenant, None)
            else:
                merged[tenant] = value
        body[key] = merged
    return body


@pools.command("upsert")
@api_options
@click.argument("name")
@click.option("--max-attempts", type=int, help="Attempts before a run is dead [new pool: 3].")
@click.option("--lease-s", type=int, help="Lease length workers use [new pool: 45].")
@click.option("--retention-s", type=int,
              help="Finished runs older than this are deleted; 0 keeps them [new pool: 7 days].")
@click.option("--paused/--resumed", default=None,
              help="A paused pool's runs are not claimed (submits are accepted).")
@click.option("--default-max-in-flight",
              help="Per-tenant cap for tenants without their own; `none` for no cap.")
@click.option("--priority-aging-s", type=int, help="Waiting worth one priority point.")
@click.option("--tool-env", help="Comma-separated names of worker environment variables "
                                 "the pool's tools may see; '' for none.")
@click.option("--limit", "limits", multiple=True, metavar="TENANT=N",
              help="A tenant's cap (repeatable); TENANT=none removes it.")
@click.option("--priority", "bands", multiple=True, metavar="TENANT=MIN:MAX",
              help="A tenant's priority band (repeatable); TENANT=none removes it.")
@click.option("--rate", "rates", multiple=True, metavar="TENANT=SUBMITS/TOKENS",
              help="A tenant's runs submitted and model tokens per minute, `-` for none "
                   "(repeatable; docs/limits.md); TENANT=none removes both.")
def pools_upsert(api_url: str, token: str, as_json: bool, name: str,
                 max_attempts: int | None, lease_s: int | None, retention_s: int | None,
                 paused: bool | None, default_max_in_flight: str | None,
                 priority_aging_s: int | None, tool_env: str | None,
                 limits: tuple[str, ...], bands: tuple[str, ...],
                 rates: tuple[str, ...] = ()) -> None:
    """Create or update a pool (also: `pools set`). Only what is given changes:
    settings and tenants left out keep their current values (a new pool starts
    from the defaults); TENANT=none removes a tenant's setting."""
    given: dict[str, Any] = {k: v for k, v in (
        ("max_attempts", max_attempts), ("lease_s", lease_s), ("retention_s", retention_s),
        ("paused", paused), ("priority_aging_s", priority_aging_s)) if v is not None}
    if default_max_in_flight is not None:
        try:
            given["default_max_in_flight"] = (None if default_max_in_flight == "none"
                                              else _count(default_max_in_flight))
        except ValueError:
            raise click.BadParameter(f"{default_max_in_flight!r}: a count or none",
                                     param_hint="--default-max-in-flight") from None
    if tool_env is not None:
        given["tool_env"] = [n.strip() for n in tool_env.split(",") if n.strip()]
    tenant_limits = _pairs(limits, "--limit", _count)
    tenant_bands = _pairs(bands, "--priority", _band)
    with client(api_url, token) as api:
        try:
            current: dict[str, Any] | None = api.pool(name)
        except ApiError as exc:
            if exc.status != 404:
                raise
            current = None
        pool = api.upsert_pool(name, **merge_pool(current, given, tenant_limits, tenant_bands,
                                                  _pairs(rates, "--rate", _rate)))
    if as_json:
        emit_json(pool)
    else:
        console.print(f"pool {pool['name']}: {'saved' if current else 'created'}")


pools.add_command(pools_upsert, "set")
