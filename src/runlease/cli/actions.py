"""`runlease runs cancel|redrive|reprioritize`: one run, or many by ids or
by filter (`runlease runs cancel --status pending --dry-run`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from runlease.cli.output import count
from runlease.cli.runs import runs
from runlease.cli.terminal import api_options, client, emit_json, label_filters, out, run_id
from runlease.cli.terminal import run_id as resolve
from runlease.client import BulkView

STATUSES = ["pending", "leased", "waiting", "done", "dead", "cancelled"]
PAST = {"cancel": "cancelled", "redrive": "redriven"}


@dataclass(frozen=True)
class Selection:
    """The runs a bulk action names: run ids, or filter options."""

    run_ids: tuple[str, ...]
    statuses: tuple[str, ...]
    pool: str | None
    labels: tuple[str, ...]
    tenant_id: str | None
    dry_run: bool
    every: bool = False

    def one_run(self) -> bool:
        """One run id and no dry run: the single-run call, not the bulk one.
        As kubectl refuses a bulk delete without --all or a selector, no
        ids and no filter is an error, not every run the token can see."""
        filtered = bool(self.statuses or self.pool or self.tenant_id or self.labels)
        if self.run_ids and (filtered or self.every):
            raise click.UsageError("give run ids or filter options (--status, --pool, "
                                   "--label, --tenant, --all), not both")
        if not (self.run_ids or filtered or self.every):
            raise click.UsageError("name the runs: run ids, filter options (--status, --pool, "
                                   "--label, --tenant), or --all for every run your token "
                                   "can see (an admin's: every tenant's); --dry-run counts "
                                   "them first")
        return len(self.run_ids) == 1 and not self.dry_run

    def send(self, api_url: str, token: str, as_json: bool, action: str) -> None:
        """Send the bulk action (cancel or redrive) and print what it did."""
        with client(api_url, token) as api:
            send = api.bulk_cancel if action == "cancel" else api.bulk_redrive
            ids = [run_id(api, given) for given in self.run_ids]
            result = send(ids or None, status=self.statuses or None,
                          pool=self.pool, tenant_id=self.tenant_id,
                          label=label_filters(self.labels), dry_run=self.dry_run)
        _print_bulk(result, as_json)


def selection_options(command: Callable[..., None]) -> Callable[..., None]:
    """The run ids and filter options, handed to the command as one Selection."""
    @functools.wraps(command)
    def with_selection(*, run_ids: tuple[str, ...], statuses: tuple[str, ...],
                       pool: str | None, labels: tuple[str, ...], tenant_id: str | None,
                       dry_run: bool, every: bool, **rest: Any) -> None:
        command(selection=Selection(run_ids, statuses, pool, labels, tenant_id, dry_run,
                                    every), **rest)
    wrapped: Any = with_selection
    wrapped = click.option("--all", "every", is_flag=True,
                           help="Every run the token can see (required when no id or "
                                "filter is given).")(wrapped)
    wrapped = click.option("--dry-run", is_flag=True,
                           help="Count the runs it would change; change none.")(wrapped)
    wrapped = click.option("--tenant", "tenant_id",
                           help="Admin: only this tenant's runs.")(wrapped)
    wrapped = click.option("--pool", help="Only runs of this pool.")(wrapped)
    wrapped = click.option("-l", "--label", "labels", multiple=True, metavar="KEY=VALUE",
                           help="Only runs with this label (repeatable; all must "
                                "match).")(wrapped)
    wrapped = click.option("--status", "statuses", multiple=True,
                           type=click.Choice(STATUSES),
                           help="Only runs in this status (repeatable).")(wrapped)
    return click.argument("run_ids", nargs=-1)(wrapped)  # type: ignore[no-any-return]


def _print_bulk(result: BulkView, as_json: bool) -> None:
    if as_json:
        emit_json(result)
        return
    if result.dry_run:
        out(f"dry run: {count(result.matched, 'run')} would be {PAST[result.action]}")
        return
    out(f"{result.action}: {result.affected} of {count(result.matched, 'run')} "
        f"(operation {result.op_id})")
    if result.truncated:
        out("stopped at the bound of one request: run it again for the rest")


@runs.command("cancel")
@api_options
@selection_options
def cancel(api_url: str, token: str, as_json: bool, selection: Selection) -> None:
    """Stop a run (its tools too), or many: by ids, by --status/--pool/
    --label, or --all (every pending and leased run the token can see)."""
    if not selection.one_run():
        selection.send(api_url, token, as_json, "cancel")
        return
    with client(api_url, token) as api:
        run = api.cancel(run_id(api, selection.run_ids[0]))
    if as_json:
        emit_json(run)
    else:
        state = "cancel requested" if run.status == "leased" else run.status
        out(f"{run.id}: {state}")


@runs.command("redrive")
@api_options
@selection_options
def redrive(api_url: str, token: str, as_json: bool, selection: Selection) -> None:
    """Send dead runs back to the queue, attempts reset (admin): by ids, every
    dead run matching --pool/--label/--tenant, or --all."""
    selection.one_run()
    selection.send(api_url, token, as_json, "redrive")


@runs.command("reprioritize")
@api_options
@click.argument("run_id")
@click.option("--priority", required=True, type=click.IntRange(-100, 100),
              help="The new priority.")
def reprioritize(api_url: str, token: str, as_json: bool, run_id: str, priority: int) -> None:
    """Give a pending run a new priority (within your band in its pool)."""
    with client(api_url, token) as api:
        run = api.reprioritize(resolve(api, run_id), priority)
    if as_json:
        emit_json(run)
    else:
        out(f"{run.id}: priority {run.priority}")
