"""`runlease dev --demo`: runs for three tenants through the API, shown live.

Script-agent runs: quick ones, slow ones, one that fails on its first
attempt and is retried after the backoff, one that fails for good (a dead
letter), shell steps, a long one the demo cancels while it runs, and one
that waits for a person's approval (status `waiting`, holding no worker)
which the demo approves. The terminal shows each run's state as it changes,
then a summary per tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from runlease.client import AsyncClient, Conflict, RunView

Echo = Callable[[str], None]

PLANS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "acme": [
        ("quick", {"steps": [{"emit": {"text": "hello"}}, {"sleep": 0.5}]}),
        ("quick", {"steps": [{"emit": {"text": "hello"}}, {"sleep": 0.7}]}),
        ("slow", {"steps": [{"emit": {"text": "thinking"}}, {"sleep": 4},
                            {"emit": {"text": "done thinking"}}]}),
        ("flaky", {"steps": [{"emit": {"text": "calling a flaky tool"}},
                             {"fail": "retryable", "until_attempt": 2},
                             {"emit": {"text": "worked the second time"}}]}),
    ],
    "globex": [
        ("shell", {"steps": [{"shell": ["sh", "-c", "echo hello from $RUNLEASE_RUN_ID"]},
                             {"emit": {"text": "ran a shell step"}}]}),
        ("shell", {"steps": [{"shell": ["sh", "-c", "sleep 1; uname -s"]}]}),
        ("broken", {"steps": [{"fail": "fatal"}]}),
    ],
    "initech": [
        ("quick", {"steps": [{"sleep": 1}, {"emit": {"text": "ok"}}]}),
        ("to cancel", {"steps": [{"emit": {"text": "starting a long job"}},
                                 {"shell": ["sh", "-c", "sleep 600"]}]}),
        ("approval", {"steps": [{"emit": {"text": "ready to deploy"}},
                                {"input": {"name": "deploy", "prompt": "Deploy to production?",
                                           "schema": {"type": "boolean"},
                                           "timeout_s": 600}},
                                {"emit": {"text": "deployed"}}]}),
    ],
}


def table(runs: dict[str, tuple[str, RunView]], title: str) -> Table:
    t = Table(title=title)
    # Whole ids: what `runlease runs show` and the console's search take.
    t.add_column("run", no_wrap=True, min_width=36)
    for column in ("tenant", "kind", "status", "attempt", "events", "error"):
        t.add_column(column)
    colors = {"done": "green", "dead": "red", "cancelled": "yellow", "leased": "cyan",
              "pending": "white", "waiting": "magenta"}
    for kind, run in runs.values():
        t.add_row(str(run.id), run.tenant_id, kind,
                  f"[{colors[run.status]}]{run.status}[/]", f"{run.attempts}/{run.max_attempts}",
                  str(run.last_event_seq), run.error_code or "")
    return t


def summarize(runs: dict[str, tuple[str, RunView]]) -> dict[str, Counter[str]]:
    summary: dict[str, Counter[str]] = {t: Counter() for t in PLANS}
    for _, run in runs.values():
        summary[run.tenant_id][run.status] += 1
        summary[run.tenant_id]["retried"] += run.attempts > 1
        summary[run.tenant_id]["events"] += run.last_event_seq
    return summary


def summary_table(summary: dict[str, Counter[str]]) -> Table:
    t = Table(title="summary")
    columns = ("done", "dead", "cancelled", "retried", "events")
    t.add_column("tenant")
    for column in columns:
        t.add_column(column)
    for tenant, counts in summary.items():
        t.add_row(tenant, *(str(counts[c]) for c in columns))
    return t


async def run_api_demo(base: str, tokens: dict[str, str], admin: str, echo: Echo,
                       timeout_s: float = 120.0) -> dict[str, Counter[str]]:
    clients = {t: AsyncClient(base, tokens[t]) for t in PLANS}
    runs: dict[str, tuple[str, RunView]] = {}
    try:
        for tenant, plans in PLANS.items():
            for kind, plan in plans:
                run = await clients[tenant].submit(plan, max_attempts=3)
                runs[str(run.id)] = (kind, run)
        echo(f"submitted {len(runs)} runs for {', '.join(PLANS)}; following them live")
        to_cancel = next(r for k, r in runs.values() if k == "to cancel")
        cancelled = approved = False
        started = time.monotonic()
        console = Console()
        with Live(table(runs, "runs"), console=console, refresh_per_second=4) as live:
            while True:
                for run_id, (kind, run) in list(runs.items()):
                    if not run.finished:
                        fresh = await clients[run.tenant_id].get(run_id)
                        runs[run_id] = (kind, fresh)
                current = runs[str(to_cancel.id)][1]
                if not cancelled and current.status == "leased" and current.last_event_seq:
                    # It may have finished since it was read: a 409, nothing to stop.
                    with contextlib.suppress(Conflict):
                        await clients[current.tenant_id].cancel(current.id)
                    cancelled = True
                for run_id, (kind, run) in runs.items():
                    if kind == "approval" and run.status == "waiting" and not approved:
                        # What a person does from the console, a chat button or
                        # `runlease runs input <id> --name deploy --value true`.
                        with contextlib.suppress(Conflict):
                            await clients[run.tenant_id].give_input(run_id, "deploy", True)
                        approved = True
                        echo(f"run {run_id} asked 'Deploy to production?': approved")
                live.update(table(runs, f"runs ({time.monotonic() - started:.0f} s)"))
                if all(r.finished for _, r in runs.values()):
                    break
                if time.monotonic() - started > timeout_s:
                    echo("the demo timed out; are the workers running?")
                    break
                await asyncio.sleep(0.25)
        summary = summarize(runs)
        console.print()
        console.print(summary_table(summary))
        async with AsyncClient(base, admin) as ops:
            dead = await ops.dead_letters()
        echo(f"dead letters (admin view): {len(dead.items)}: redrive them in the console "
             f"({base}/ui/dead, admin token), or with `runlease dead list` and "
             "`runlease dead redrive <id>`")
        return summary
    finally:
        for c in clients.values():
            await c.aclose()
