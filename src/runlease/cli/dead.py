"""`runlease dead ...`: list dead letters and send them back to the queue
(admin)."""

from __future__ import annotations

import click

from runlease.cli.output import count
from runlease.cli.terminal import (
    api_options,
    client,
    emit_json,
    out,
    page_out,
    run_id,
    runs_table,
)


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
    page_out(page, as_json, runs_table)


@dead.command("redrive")
@api_options
@click.argument("run_ids", nargs=-1, required=True)
@click.option("--dry-run", is_flag=True, help="Count the dead runs it would redrive; "
                                               "change none.")
def redrive(api_url: str, token: str, as_json: bool, run_ids: tuple[str, ...],
            dry_run: bool) -> None:
    """Send dead runs back to the queue, attempts reset (one call a run: a
    run that is not dead is an error; `runs redrive` skips it instead)."""
    with client(api_url, token) as api:
        ids = [run_id(api, given) for given in run_ids]
        if dry_run:
            counted = api.bulk_redrive(ids, dry_run=True)
            if as_json:
                emit_json(counted)
            else:
                out(f"dry run: {count(counted.matched, 'run')} would be redriven")
            return
        done = [api.redrive(one) for one in ids]
    if as_json:
        emit_json(done)
    else:
        for run in done:
            out(f"{run.id}: {run.status}")
