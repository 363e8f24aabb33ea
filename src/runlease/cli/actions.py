"""`runlease runs cancel|redrive|reprioritize`: one run, or many by ids or
by filter (`runlease runs cancel --status pending --dry-run`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from runlease.cli.runs import runs
from runlease.cli.terminal import api_options, client, emit_json, out
from runlease.client import BulkView

F = TypeVar("F", bound=Callable[..., Any])
STATUSES = ["pending", "leased", "done", "dead", "cancelled"]


def filter_options(command: F) -> F:
    wrapped: Any = command
    wrapped = click.option("--dry-run", is_flag=True,
                           help="Count the runs it would change; change none.")(wrapped)
    wrapped = click.option("--tenant", "tenant_id",
                           help="Admin: only this tenant's runs.")(wrapped)
    wrapped = click.option("--pool", help="Only runs of this pool.")(wrapped)
    wrapped = click.option("--label", "labels", multiple=True, metavar="KEY:VALUE",
                           help="Only runs with this label (repeatable; all must "
                                "match).")(wrapped)
    return click.option("--status", "statuses", multiple=True,  # type: ignore[no-any-return]
                        type=click.Choice(STATUSES),
                        help="Only runs in this status (repeatable).")(wrapped)


def _bulk(api_url: str, token: str, as_json: bool, action: str, run_ids: tuple[str, ...],
          statuses: tuple[str, ...], pool: str | None, labels: tuple[str, ...],
          tenant_id: str | None, dry_run: bool) -> None:
    """Send the bulk action (cancel or redrive) and print what it did."""
    with client(api_url, token) as api:
        send = api.bulk_cancel if action == "cancel" else api.bulk_redrive
        result = send(list(run_ids) or None, status=statuses or None, pool=pool,
                      tenant_id=tenant_id, label=labels, dry_run=dry_run)
    _print_bulk(result, as_json)


def _print_bulk(result: BulkView, as_json: bool) -> None:
    if as_json:
        emit_json(result)
        return
    if result.dry_run:
        out(f"dry run: {result.matched} runs would be {result.action}ed"
                      .replace("cancele", "cancelle"))
        return
    out(f"{result.action}: {result.affected} of {result.matched} runs "
                  f"(operation {result.op_id})")
    if result.truncated:
        out("stopped at the bound of one request: run it again for the rest")


def _by_filter(run_ids: tuple[str, ...], statuses: tuple[str, ...], pool: str | None,
               tenant_id: str | None, dry_run: bool, labels: tuple[str, ...] = ()) -> bool:
    if run_ids and (statuses or pool or tenant_id or labels):
        raise click.UsageError("give run ids or filter options (--status, --pool, --label, "
                               "--tenant), not both")
    return not (len(run_ids) == 1 and not dry_run)


@runs.command("cancel")
@api_options
@click.argument("run_ids", nargs=-1)
@filter_options
def cancel(api_url: str, token: str, as_json: bool, run_ids: tuple[str, ...],
           statuses: tuple[str, ...], pool: str | None, labels: tuple[str, ...],
           tenant_id: str | None, dry_run: bool) -> None:
    """Stop a run (its tools too), or many: by ids, or by --status/--pool/
    --label (a filter with no option: every pending and leased run of yours)."""
    if not _by_filter(run_ids, statuses, pool, tenant_id, dry_run, labels):
        with client(api_url, token) as api:
            run = api.cancel(run_ids[0])
        if as_json:
            emit_json(run)
        else:
            state = "cancel requested" if run.status == "leased" else run.status
            out(f"{run.id}: {state}")
        return
    _bulk(api_url, token, as_json, "cancel", run_ids, statuses, pool, labels, tenant_id,
          dry_run)


@runs.command("redrive")
@api_options
@click.argument("run_ids", nargs=-1)
@filter_options
def redrive(api_url: str, token: str, as_json: bool, run_ids: tuple[str, ...],
            statuses: tuple[str, ...], pool: str | None, labels: tuple[str, ...],
            tenant_id: str | None, dry_run: bool) -> None:
    """Send dead runs back to the queue, attempts reset: by ids, or every
    dead run matching --pool/--label (and, for admins, --tenant)."""
    _by_filter(run_ids, statuses, pool, tenant_id, dry_run, labels)
    _bulk(api_url, token, as_json, "redrive", run_ids, statuses, pool, labels, tenant_id,
          dry_run)


@runs.command("reprioritize")
@api_options
@click.argument("run_id")
@click.option("--priority", required=True, type=click.IntRange(-100, 100),
              help="The new priority.")
def reprioritize(api_url: str, token: str, as_json: bool, run_id: str, priority: int) -> None:
    """Give a pending run a new priority (within your band in its pool)."""
    with client(api_url, token) as api:
        run = api.reprioritize(run_id, priority)
    if as_json:
        emit_json(run)
    else:
        out(f"{run.id}: priority {run.priority}")
