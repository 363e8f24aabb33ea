"""`runlease threads show`: a thread (issue 27) and its runs in submit order."""

from __future__ import annotations

import click

from runlease.cli.terminal import api_options, client, emit_json, out, runs_table


@click.group()
def threads() -> None:
    """A tenant's threads: one run at a time each, in submit order."""


@threads.command("show")
@api_options
@click.argument("thread_id")
@click.option("--tenant", help="Admin: the thread's tenant.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
@click.option("--cursor", help="After this thread position (a page's next cursor).")
def show(api_url: str, token: str, as_json: bool, thread_id: str, tenant: str | None,
         limit: int, cursor: str | None) -> None:
    """The thread's active (or next) run, its latest answer, and its runs, oldest first."""
    with client(api_url, token) as api:
        thread = api.thread(thread_id, tenant=tenant)
        page = api.thread_runs(thread_id, tenant=tenant, limit=limit, cursor=cursor)
    if as_json:
        emit_json({"thread": thread, "runs": page.items, "next_cursor": page.next_cursor})
        return
    for key in ("thread_id", "head_run_id", "head_status", "latest_run_id", "runs"):
        value = thread.get(key)
        out(f"{key}: {'<none>' if value is None else value}")
    out("runs, in submit order:")
    runs_table(page.items)
    if page.next_cursor:
        out(f"next: --cursor {page.next_cursor}")
