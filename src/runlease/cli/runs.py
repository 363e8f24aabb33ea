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
)
from runlease.client import RunEnded, StepView, StreamEvent

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@click.group()
def runs() -> None:
    """Submit, list, show, cancel and follow runs."""


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
