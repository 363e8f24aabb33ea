"""Tool output a hostile tenant controls (issue 32): the bytes and events a
run's tools may store are bounded over the whole run (11.8 kB of input
stored 14.4 MB of events), the cut marked; a NUL byte in the output is
shown as U+FFFD, not a failed run with a traceback."""

from __future__ import annotations

import psycopg
import pytest

from runlease.client import AsyncClient, RunEnded, StreamEvent
from runlease.db.store import RunStore
from runlease.worker import context
from tests.support.api import Api
from tests.support.workers import running_worker


def shells(*commands: str) -> dict[str, object]:
    return {"steps": [{"shell": ["sh", "-c", c]} for c in commands]}


def stored(db_url: str, run_id: object) -> tuple[int, int]:
    """(events, bytes of their data) the run has stored."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*), coalesce(sum(octet_length(data::text)), 0)"
                           " FROM agent_run_events WHERE run_id = %s", (run_id,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_a_nul_byte_in_tool_output_is_replaced_not_fatal(
    api: Api, db_url: str, live_store: RunStore
) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme, running_worker(db_url):
        run = await acme.submit(shells("printf 'before\\000after\\n'; printf 'e\\000rr' >&2"))
        items = [i async for i in acme.events(run.id)]
        final = await acme.get(run.id)
    assert items[-1] == RunEnded("done", None, 1), final
    texts = "".join(i.data.get("text", "") for i in items
                    if isinstance(i, StreamEvent) and i.kind == "tool.output")
    assert "before\ufffdafter" in texts
    assert "e\ufffdrr" in texts
    steps = await live_store.get_steps(run.id)
    assert "before\ufffdafter" in steps["0"].result["stdout"]


async def test_a_runs_tool_output_is_bounded_over_all_its_tool_calls(
    api: Api, db_url: str, monkeypatch: object
) -> None:
    """Each call was bounded (64 KiB), the run was not: 200 steps of 64 KiB."""
    steps = 40
    script = "head -c 70000 /dev/zero | tr '\\0' 'x' | fold -w 100"
    async with AsyncClient(api.url, api.token("acme")) as acme, running_worker(db_url):
        run = await acme.submit(shells(*[script] * steps))
        items = [i async for i in acme.events(run.id)]
    assert items[-1] == RunEnded("done", None, 1)
    outputs = [i.data for i in items if isinstance(i, StreamEvent) and i.kind == "tool.output"]
    shown = sum(len(d["text"]) for d in outputs if d["stream"] in ("stdout", "stderr"))
    assert shown <= context.RUN_TOOL_OUTPUT_MAX_BYTES
    assert shown > context.RUN_TOOL_OUTPUT_MAX_BYTES - 70_000
    notes = [d for d in outputs if d["stream"] == "note" and d.get("run_truncated")]
    assert len(notes) == 1, notes  # marked once, where the run's bound was reached
    events, size = stored(db_url, run.id)
    assert events <= context.RUN_TOOL_OUTPUT_MAX_EVENTS + 3 * steps + 10
    assert size <= context.RUN_TOOL_OUTPUT_MAX_BYTES + 200 * steps + 64 * 1024


async def test_the_events_bound_holds_over_attempts(
    api: Api, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many small outputs: the count of events is the bound, counted over
    the run's attempts (a retried run does not start again from zero)."""
    monkeypatch.setattr(context, "RUN_TOOL_OUTPUT_MAX_EVENTS", 12)
    steps: list[dict[str, object]] = [{"shell": ["sh", "-c", f"echo line {i}"]}
                                      for i in range(8)]
    steps.append({"fail": "retryable", "until_attempt": 2})
    steps += [{"shell": ["sh", "-c", f"echo again {i}"]} for i in range(8)]
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            running_worker(db_url, poll_interval_s=0.1):
        run = await acme.submit({"steps": steps}, max_attempts=3)
        items = [i async for i in acme.events(run.id)]
    assert isinstance(items[-1], RunEnded)
    assert items[-1].status == "done"
    outputs = [i.data for i in items if isinstance(i, StreamEvent) and i.kind == "tool.output"]
    assert len(outputs) <= 12
    assert [d.get("run_truncated") for d in outputs].count(True) == 1
