"""`runlease runs ...`: show and follow runs through the HTTP API (submit and
list are in run_commands.py, cancel, redrive and reprioritize in actions.py)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import click

from runlease.cli import output as printing
from runlease.cli.terminal import (
    api_options,
    client,
    emit_json,
    jsonable,
    out,
    page_out,
    runs_table,
)
from runlease.cli.terminal import run_id as terminal_run_id
from runlease.client import RunEnded, StepView, StreamEvent

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@click.group()
def runs() -> None:
    """Submit, list, show, cancel and follow runs."""


@runs.command("show")
@api_options
@click.argument("run_id")
def show(api_url: str, token: str, as_json: bool, run_id: str) -> None:
    """One run, in full, and its children (the first 20)."""
    with client(api_url, token) as api:
        run = api.get(terminal_run_id(api, run_id))
        kids = None if as_json else api.list(parent_run_id=run.id, limit=20)
    if as_json:
        emit_json(run)
        return
    # As `kubectl describe`: one field a line, times in RFC 3339, none as <none>.
    fields = {k: v for k, v in dataclasses.asdict(run).items() if k != "created"}
    width = max(len(k) for k in fields) + 1
    for key, value in fields.items():
        click.echo(f"{key + ':':<{width}} {printing.cell(value)}")
    if kids is not None and kids.items:
        click.echo("children:")
        runs_table(kids.items)


STEP_COLUMNS = (
    printing.Column("STEP", lambda s: s.key),
    printing.Column("ATTEMPT", lambda s: s.attempt),
    printing.Column("COMMITTED", lambda s: s.created_at),
    printing.Column("RESULT", lambda s: json.dumps(s.result)[:2000]),
)


def steps_table(steps: list[StepView]) -> None:
    printing.table(steps, STEP_COLUMNS)


@runs.command("steps")
@api_options
@click.argument("run_id")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100))
@click.option("--cursor", help="Start after this step key (a page's next cursor).")
def steps(api_url: str, token: str, as_json: bool, run_id: str, limit: int,
          cursor: str | None) -> None:
    """A run's committed durable steps (what its tools returned), in key order."""
    with client(api_url, token) as api:
        page = api.steps(terminal_run_id(api, run_id), limit=limit, cursor=cursor)
    page_out(page, as_json, steps_table)


# `runs tail`'s exit status by how the run ended, as `kubectl wait` fails
# when the condition is not met (1 and 2 are errors and usage errors).
TAIL_EXIT = {"done": 0, "dead": 3, "cancelled": 4}


@runs.command("tail")
@api_options
@click.argument("run_id")
@click.option("--after", default=0, show_default=True, help="Start after this event seq.")
def tail(api_url: str, token: str, as_json: bool, run_id: str, after: int) -> None:
    """Follow a run's events until it finishes; survives dropped connections.
    Exit status: 0 the run is done, 3 it ended dead, 4 cancelled; 1 an error
    (the API unreachable or refusing)."""
    ended: str | None = None
    with client(api_url, token) as api:
        for item in api.events(terminal_run_id(api, run_id), after=after):
            if isinstance(item, RunEnded):
                ended = item.status
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
    if ended is not None and TAIL_EXIT.get(ended, 1):
        sys.exit(TAIL_EXIT.get(ended, 1))
