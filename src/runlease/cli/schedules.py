"""`runlease schedules create|list|show|pause|resume|delete`: cron schedules
that enqueue a run at each tick, from a terminal."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from runlease.cli import output as printing
from runlease.cli.retry import retry_kwargs, retry_options
from runlease.cli.run_commands import keyed_debounce, keyed_singleton
from runlease.cli.terminal import api_options, client, emit_json, out, page_out
from runlease.client import Client, ScheduleView


@click.group()
def schedules() -> None:
    """Cron schedules that enqueue runs."""


COLUMNS = (
    printing.Column("ID", lambda s: s.id),
    printing.Column("NAME", lambda s: s.name),
    printing.Column("CRON", lambda s: s.cron),
    printing.Column("STATE", lambda s: "paused" if s.paused else "active"),
    printing.Column("NEXT TICK", lambda s: printing.until(s.next_tick_at)),
    printing.Column("NEXT TICK AT", lambda s: s.next_tick_at, wide=True),
    printing.Column("TENANT", lambda s: s.tenant_id, wide=True),
    printing.Column("TIMEZONE", lambda s: s.timezone, wide=True),
    printing.Column("OVERLAP", lambda s: s.overlap, wide=True),
    printing.Column("LAST ERROR", lambda s: s.last_error, wide=True),
)


def _table(items: list[ScheduleView]) -> None:
    printing.table(items, COLUMNS)


def _show(schedule: ScheduleView, as_json: bool, verb: str) -> None:
    if as_json:
        emit_json(schedule)
        return
    state = "paused" if schedule.paused else f"next tick {printing.iso(schedule.next_tick_at)}"
    out(f"{verb}: {schedule.name} {schedule.id} ({state})")


@schedules.command("create")
@api_options
@click.argument("name")
@click.option("--cron", required=True, help='Five fields, e.g. "30 2 * * *".')
@click.option("--timezone", default="UTC", show_default=True,
              help="The IANA time zone the cron expression is read in.")
@click.option("--input", "input_json", required=True,
              help="Each run's input, a JSON object (or @file.json).")
@click.option("--pool")
@click.option("--priority", type=int)
@click.option("--max-attempts", type=int)
@click.option("--overlap", type=click.Choice(["skip", "allow"]), default="skip",
              show_default=True, help="skip: no run while the previous tick's still runs.")
@click.option("--paused", is_flag=True, help="Create it paused.")
@click.option("--tenant", "tenant_id", help="Admin only: the schedule's tenant.")
@click.option("--thread", "thread_id", help="Each tick's run goes into this thread (one run "
                                            "of it at a time, in submit order).")
@click.option("--multitask", type=click.Choice(["enqueue", "reject", "interrupt", "rollback"]),
              help="With --thread, when the thread is busy at a tick (default enqueue).")
@click.option("--key", "concurrency_key", help="Each tick's run's concurrency key.")
@click.option("--singleton", metavar="KEY[:cancel_in_progress]",
              help="A tick while KEY's run is pending or active is answered with it (or "
                   "cancels it, with :cancel_in_progress).")
@click.option("--debounce", metavar="KEY:WINDOW_S:MAX_DELAY_S",
              help="Ticks of KEY within WINDOW_S make one run.")
@retry_options
def create(api_url: str, token: str, as_json: bool, name: str, cron: str, timezone: str,
           input_json: str, pool: str | None, priority: int | None,
           max_attempts: int | None, overlap: str, paused: bool, tenant_id: str | None,
           thread_id: str | None = None, multitask: str | None = None,
           concurrency_key: str | None = None, singleton: str | None = None,
           debounce: str | None = None, **retry: Any) -> None:
    """Create a schedule NAME."""
    if input_json.startswith("@"):
        with open(input_json[1:]) as f:
            input_json = f.read()
    try:
        payload = json.loads(input_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--input") from None
    template: dict[str, Any] = {"input": payload}
    for key, value in (("pool", pool), ("priority", priority),
                       ("max_attempts", max_attempts), ("thread_id", thread_id),
                       ("multitask", multitask), ("concurrency_key", concurrency_key),
                       ("singleton", keyed_singleton(singleton)),
                       ("debounce", keyed_debounce(debounce)),
                       *retry_kwargs(**retry).items()):
        if value is not None:
            template[key] = value
    with client(api_url, token) as api:
        schedule = api.create_schedule(name, cron, template, timezone=timezone,
                                       overlap=overlap, paused=paused, tenant_id=tenant_id)
    _show(schedule, as_json, "created")


@schedules.command("list")
@api_options
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500))
@click.option("--cursor")
def list_schedules(api_url: str, token: str, as_json: bool, limit: int,
                   cursor: str | None) -> None:
    """Your schedules by name (admin: everyone's)."""
    with client(api_url, token) as api:
        page = api.schedules(limit=limit, cursor=cursor)
    page_out(page, as_json, _table, json.dumps)


def _in_full(schedule: ScheduleView) -> None:
    printing.table([schedule], [*COLUMNS, printing.Column("TEMPLATE", lambda s: s.template)])


def _said(verb: str) -> Callable[[ScheduleView], None]:
    return lambda schedule: _show(schedule, False, verb)


def _on_one(name: str, help_: str, call: Callable[[Client, str], ScheduleView],
            text: Callable[[ScheduleView], None]) -> click.Command:
    """show, pause and resume: one call on a schedule named by its id, the
    schedule it answers shown as JSON or as `text` shows it."""
    @schedules.command(name, help=help_)
    @api_options
    @click.argument("schedule_id")
    def command(api_url: str, token: str, as_json: bool, schedule_id: str) -> None:
        with client(api_url, token) as api:
            schedule = call(api, schedule_id)
        if as_json:
            emit_json(schedule)
        else:
            text(schedule)
    return command


show = _on_one("show", "One schedule, in full.", Client.schedule, _in_full)
pause = _on_one("pause", "Enqueue nothing until resumed.", Client.pause_schedule,
                _said("paused"))
resume = _on_one("resume", "Tick again, from the first tick after now.",
                 Client.resume_schedule, _said("resumed"))


@schedules.command("delete")
@api_options
@click.argument("schedule_id")
def delete(api_url: str, token: str, as_json: bool, schedule_id: str) -> None:
    """Delete a schedule (the runs it enqueued stay)."""
    with client(api_url, token) as api:
        api.delete_schedule(schedule_id)
    if as_json:
        emit_json({"deleted": schedule_id})
    else:
        out(f"deleted: {schedule_id}")
