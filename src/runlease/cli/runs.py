"""`runlease runs ...`: submit, list, show, cancel and follow runs through the
HTTP API."""

from __future__ import annotations

import json
import re

import click
from rich.table import Table

from runlease.cli.terminal import (
    api_options,
    client,
    emit_json,
    jsonable,
    out,
    page_out,
    runs_table,
)
from runlease.client import RunEnded, StepView, StreamEvent
from runlease.core.states import RunStatus

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


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
        out(f"{'submitted' if run.created else 'already submitted'}: {run.id} "
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
    page_out(page, as_json, runs_table)


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
    for key, value in jsonable(run).items():
        if key != "created":
            shown = json.dumps(value) if isinstance(value, dict) else value
            out(f"[bold]{key}[/]: {shown}")


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
        out(f"{run.id}: {state}")


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
    page_out(page, as_json, steps_table)


@runs.command("tail")
@api_options
@click.argument("run_id")
@click.option("--after", default=0, show_default=True, help="Start after this event seq.")
def tail(api_url: str, token: str, as_json: bool, run_id: str, after: int) -> None:
    """Follow a run's events until it finishes; survives dropped connections."""
    with client(api_url, token) as api:
        for item in api.events(run_id, after=after):
            if as_json:
                click.echo(json.dumps(jsonable(item)))
            elif isinstance(item, StreamEvent) and item.kind == "tool.output" \
                    and isinstance(item.data.get("text"), str):
                # A tool's output as it printed it, not as JSON; but no
                # control characters: a run's output must not drive the terminal.
                click.echo(_CONTROL.sub("?", item.data["text"]), nl=False)
            elif isinstance(item, StreamEvent):
                out(f"[dim]{item.seq:>5}[/] [bold]{item.kind}[/] {json.dumps(item.data)}")
            elif isinstance(item, RunEnded):
                out(f"[bold]end[/]: {item.status}"
                    + (f" ({item.error_code})" if item.error_code else ""))
