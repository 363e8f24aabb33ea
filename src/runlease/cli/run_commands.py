"""`runlease runs submit` (one run, or a JSON-lines file in batches) and
`runlease runs list` (with every filter of GET /v1/runs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from runlease.cli import terminal
from runlease.cli.output import count
from runlease.cli.retry import retry_kwargs, retry_options
from runlease.cli.runs import runs
from runlease.cli.terminal import (
    api_options,
    client,
    emit_json,
    label_filters,
    out,
    page_out,
    run_id,
    runs_table,
)
from runlease.core.states import RunStatus

BATCH = 1000


def _labels(items: tuple[str, ...]) -> dict[str, str] | None:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: give key=value", param_hint="--label")
        labels[key] = value
    return labels or None


def _time(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r}: an RFC 3339 time (2026-12-01T09:00:00Z)",
                                 param_hint=option) from None
    if at.tzinfo is None:
        raise click.BadParameter(f"{value!r}: give the offset (Z or +01:00)", param_hint=option)
    return at


def keyed_singleton(value: str | None) -> dict[str, str] | None:
    if value is None:
        return None
    # A key may hold ':' itself: only a known policy at the end is one.
    key, sep, policy = value.rpartition(":")
    if sep and policy in ("skip", "cancel_in_progress"):
        return {"key": key, "on_conflict": policy}
    return {"key": value, "on_conflict": "skip"}


def keyed_debounce(value: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    key, window, delay = ["", "", "", *value.rsplit(":", 2)][-3:]  # a key may hold ':'
    try:
        return {"key": key, "window_s": float(window), "max_delay_s": float(delay)}
    except ValueError:
        raise click.BadParameter(f"{value!r}: give KEY:WINDOW_S:MAX_DELAY_S",
                                 param_hint="--debounce") from None


def _jsonl(path: str) -> Iterator[dict[str, Any]]:
    """The file's runs, one JSON object a line (blank lines skipped)."""
    with click.open_file(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                run = json.loads(line)
            except json.JSONDecodeError as exc:
                raise click.BadParameter(f"line {n}: not JSON: {exc}",
                                         param_hint="--file") from None
            if not isinstance(run, dict) or not isinstance(run.get("input"), dict):
                raise click.BadParameter(f"line {n}: a run is an object with an `input` "
                                         "object", param_hint="--file")
            yield run


@runs.command("submit")
@api_options
@click.option("--input", "input_json", help="The run input, a JSON object (or @file.json).")
@click.option("--file", "runs_file", type=click.Path(dir_okay=False, allow_dash=True),
              help="Submit many: a JSON-lines file (- for stdin), one run a line, each a "
                   "submit body ({\"input\": {...}, \"labels\": ..., \"idempotency_key\": "
                   "...}), sent in batches of 1,000.")
@click.option("--pool")
@click.option("--priority", type=int)
@click.option("--max-attempts", type=int)
@click.option("--budget", help="A JSON object: max_turns, max_tool_calls, deadline_s, "
                               "max_tokens, max_cost.")
@click.option("--idempotency-key")
@click.option("--tenant", "tenant_id", help="Admin only: the run's tenant.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="A label (repeatable).")
@click.option("--run-at", help="Not before this time (RFC 3339).")
@click.option("--delay-s", type=click.FloatRange(0), help="Not before this many seconds.")
@retry_options
@click.option("--parent", "parent_run_id", help="Submit it as a child of this run.")
@click.option("--webhook-url", help="POSTed a signed notice when the run finishes.")
@click.option("--dry-run", is_flag=True,
              help="With --file: read and check every line, submit nothing (checked "
                   "here: the API checks the rest when they are sent).")
@click.option("--thread", "thread_id", help="The thread (conversation) it belongs to: one run "
                                            "of a thread at a time, in submit order.")
@click.option("--multitask", type=click.Choice(["enqueue", "reject", "interrupt", "rollback",
                                                "steer"]),
              help="With --thread, when the thread is busy (default enqueue).")
@click.option("--key", "concurrency_key", help="Its concurrency key: the pool's key limits cap "
                                               "how many runs of one key run at once.")
@click.option("--singleton", metavar="KEY[:cancel_in_progress]",
              help="One run of KEY at a time: a submit while one is pending or active answers "
                   "it (or cancels it, with :cancel_in_progress).")
@click.option("--debounce", metavar="KEY:WINDOW_S:MAX_DELAY_S",
              help="Submits of KEY within WINDOW_S make one run (the last input wins), "
                   "started at most MAX_DELAY_S after the first.")
def submit(api_url: str, token: str, as_json: bool, input_json: str | None,
           runs_file: str | None, pool: str | None, priority: int | None,
           max_attempts: int | None, budget: str | None, idempotency_key: str | None,
           tenant_id: str | None, labels: tuple[str, ...], run_at: str | None,
           delay_s: float | None, parent_run_id: str | None = None,
           webhook_url: str | None = None, dry_run: bool = False,
           thread_id: str | None = None, multitask: str | None = None,
           concurrency_key: str | None = None, singleton: str | None = None,
           debounce: str | None = None, **retry: Any) -> None:
    """Enqueue a run (--input), or many from a JSON-lines file (--file)."""
    if (input_json is None) == (runs_file is None):
        raise click.UsageError("give --input (one run) or --file (many)")
    if runs_file is not None:
        _submit_file(api_url, token, as_json, runs_file, pool, tenant_id, _labels(labels),
                     dry_run)
        return
    if dry_run:
        raise click.UsageError("--dry-run is for a file of runs (--file)")
    assert input_json is not None
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
                         tenant_id=tenant_id, labels=_labels(labels),
                         run_at=_time(run_at, "--run-at"), delay_s=delay_s,
                         parent_run_id=parent_run_id and run_id(api, parent_run_id),
                         webhook_url=webhook_url,
                         thread_id=thread_id, multitask=multitask,
                         concurrency_key=concurrency_key, singleton=keyed_singleton(singleton),
                         debounce=keyed_debounce(debounce), **retry_kwargs(**retry))
    if as_json:
        emit_json(run)
    else:
        out(f"{'submitted' if run.created else 'already submitted'}: {run.id} ({run.status})")


def _submit_file(api_url: str, token: str, as_json: bool, path: str, pool: str | None,
                 tenant_id: str | None, labels: dict[str, str] | None,
                 dry_run: bool = False) -> None:
    """Each line a run; --pool, --tenant and --label fill in what a line leaves out."""
    defaults = {k: v for k, v in (("pool", pool), ("tenant_id", tenant_id)) if v is not None}
    runs_in = [{**defaults, **run, **({"labels": {**labels, **run.get("labels", {})}}
                                      if labels else {})} for run in _jsonl(path)]
    if dry_run:
        if as_json:
            emit_json({"dry_run": True, "runs": len(runs_in)})
        else:
            out(f"dry run: {count(len(runs_in), 'run')} would be submitted")
        return
    created = existing = 0
    with Progress(TextColumn("submitting"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=terminal.console, transient=as_json,
                  disable=as_json) as bar, client(api_url, token) as api:
        task = bar.add_task("runs", total=len(runs_in))
        done = []
        for start in range(0, len(runs_in), BATCH):
            part = api.submit_many(runs_in[start:start + BATCH])
            done += part
            created += sum(r.created for r in part)
            existing += sum(not r.created for r in part)
            bar.advance(task, len(part))
    if as_json:
        emit_json([{"id": str(r.id), "created": r.created} for r in done])
    else:
        out(f"submitted {count(created, 'run')}"
            + (f", {existing} already submitted" if existing else ""))


@runs.command("list")
@api_options
@click.option("--status", "statuses", multiple=True,
              type=click.Choice([s.value for s in RunStatus]), help="Any of (repeatable).")
@click.option("--pool")
@click.option("-l", "--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="All of (repeatable), as kubectl's -l.")
@click.option("--created-after")
@click.option("--created-before")
@click.option("--finished-after")
@click.option("--finished-before")
@click.option("--idempotency-key")
@click.option("--tenant", help="Admin: one tenant's runs.")
@click.option("--thread", "thread_id", help="One thread's runs (admins: with --tenant).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
@click.option("--cursor")
def list_runs(api_url: str, token: str, as_json: bool, statuses: tuple[str, ...],
              pool: str | None, labels: tuple[str, ...], created_after: str | None,
              created_before: str | None, finished_after: str | None,
              finished_before: str | None, idempotency_key: str | None, tenant: str | None,
              limit: int, cursor: str | None, thread_id: str | None = None) -> None:
    """Runs, newest first, filtered (every filter given must match)."""
    with client(api_url, token) as api:
        page = api.list(status=list(statuses), pool=pool, limit=limit, cursor=cursor,
                        thread_id=thread_id,
                        label=label_filters(labels), idempotency_key=idempotency_key, tenant=tenant,
                        created_after=_time(created_after, "--created-after"),
                        created_before=_time(created_before, "--created-before"),
                        finished_after=_time(finished_after, "--finished-after"),
                        finished_before=_time(finished_before, "--finished-before"))
    page_out(page, as_json, runs_table)
