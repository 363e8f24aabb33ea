"""The worker in-process against a real PostgreSQL: outcomes, budgets, durable
steps, cancellation, polling without LISTEN."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from runlease.db.models import Run
from runlease.db.store import NewRun, Rendered, RunStore
from runlease.worker.acker import Acker
from runlease.worker.worker import Worker
from tests.support import agents
from tests.support.proc import processes_with
from tests.support.waiting import until
from tests.support.workers import running_worker as shared_worker

FINAL = ("done", "dead", "cancelled")


def running_worker(db_url: str, agent: Callable[..., Awaitable[Any]], **settings: Any
                         ) -> AbstractAsyncContextManager[Worker]:
    # The agent callable runs; the setting only has to name something importable.
    return shared_worker(db_url, agent, **settings)


async def finished(store: RunStore, run_id: UUID, timeout_s: float = 30) -> Run:
    async def probe() -> Run | None:
        run = await store.get(run_id)
        return run if run.status in FINAL else None

    return await until(probe, timeout_s=timeout_s, what=f"run {run_id} to finish")


async def test_a_returned_value_acks_the_run(live_store: RunStore, db_url: str) -> None:
    queued = await live_store.enqueue("default", "acme", {"q": 1})
    async with running_worker(db_url, agents.echo):
        run = await finished(live_store, queued.run.id)
    assert run.status == "done"
    assert run.result_json == {"input": {"q": 1}, "attempt": 1}
    assert [e.kind for e in await live_store.events_after(run.id)] == ["message"]


async def test_a_retryable_error_retries_with_backoff(live_store: RunStore, db_url: str) -> None:
    queued = await live_store.enqueue("default", "acme", {})
    async with running_worker(db_url, agents.retry_once):
        first = await until(lambda: _status(live_store, queued.run.id, "pending", attempts=1),
                            what="the retry")
        assert first.error_code == "model_unavailable"
        assert 4 < (first.available_at - first.updated_at).total_seconds() <= 5
        run = await finished(live_store, queued.run.id, timeout_s=20)
    assert (run.status, run.attempts, run.result_json) == ("done", 2, {"attempt": 2})
    kinds = [e.kind for e in await live_store.events_after(run.id)]
    assert kinds == ["run.retrying"]


async def _status(store: RunStore, run_id: UUID, status: str, attempts: int) -> Run | None:
    run = await store.get(run_id)
    return run if run.status == status and run.attempts == attempts else None


async def test_an_unexpected_exception_is_retried_and_redacted(
    live_store: RunStore, db_url: str
) -> None:
    queued = await live_store.enqueue("default", "acme", {}, max_attempts=1)
    async with running_worker(db_url, agents.crash):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.error_code) == ("dead", "unexpected")
    assert run.error_message is not None
    assert "ValueError" in run.error_message
    assert "hunter2secret" not in run.error_message
    assert "sk-abcdefghij" not in run.error_message
    assert "[REDACTED]" in run.error_message
    assert len(run.error_message) <= 4096


async def test_a_fatal_error_is_dead_at_once(live_store: RunStore, db_url: str) -> None:
    queued = await live_store.enqueue("default", "acme", {}, max_attempts=5)
    async with running_worker(db_url, agents.fatal):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts, run.error_code) == ("dead", 1, "refused")


@pytest.mark.parametrize(
    ("agent", "budget"),
    [
        (agents.too_many_turns, {"max_turns": 3}),
        (agents.too_many_tools, {"max_tool_calls": 2}),
        (agents.sleepy, {"deadline_s": 0.5}),
    ],
    ids=["max_turns", "max_tool_calls", "deadline_s"],
)
async def test_budgets_end_the_run_dead(
    live_store: RunStore, db_url: str, agent: Callable[..., Awaitable[Any]],
    budget: dict[str, Any],
) -> None:
    queued = await live_store.enqueue("default", "acme", {"seconds": 60}, budget=budget,
                                      max_attempts=3)
    started = time.monotonic()
    async with running_worker(db_url, agent):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts, run.error_code) == ("dead", 1, "budget_exceeded")
    assert time.monotonic() - started < 10


async def test_committed_steps_do_not_run_again(
    live_store: RunStore, db_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    queued = await live_store.enqueue("default", "acme", {"log": str(log)})
    async with running_worker(db_url, agents.counted_steps):
        run = await finished(live_store, queued.run.id, timeout_s=20)
    assert run.status == "done"
    assert run.attempts == 2
    # "first" committed on attempt 1 and was not executed on attempt 2.
    assert log.read_text().splitlines() == ["first attempt=1", "second attempt=2"]
    assert run.result_json["first"] == {"name": "first", "attempt": 1}
    steps = await live_store.get_steps(run.id)
    assert (steps["first"].attempt, steps["second"].attempt) == (1, 2)


async def test_a_cooperative_agent_stops_on_cancel(live_store: RunStore, db_url: str) -> None:
    queued = await live_store.enqueue("default", "acme", {"seconds": 60}, max_attempts=3)
    async with running_worker(db_url, agents.sleepy, cancel_grace_s=30):
        await until(lambda: _has_event(live_store, queued.run.id, "started"))
        asked = time.monotonic()
        await live_store.request_cancel(queued.run.id)
        run = await finished(live_store, queued.run.id)
        latency = time.monotonic() - asked
    assert (run.status, run.attempts) == ("cancelled", 1)
    assert latency < 5  # well inside the 30 s grace: the agent saw the token
    print(f"cooperative cancel latency: {latency * 1000:.0f} ms")


async def test_a_stubborn_agent_is_cancelled_after_the_grace(
    live_store: RunStore, db_url: str
) -> None:
    queued = await live_store.enqueue("default", "acme", {})
    async with running_worker(db_url, agents.stubborn, cancel_grace_s=1):
        await until(lambda: _has_event(live_store, queued.run.id, "started"))
        asked = time.monotonic()
        await live_store.request_cancel(queued.run.id)
        run = await finished(live_store, queued.run.id)
        latency = time.monotonic() - asked
    assert run.status == "cancelled"
    assert 1 <= latency < 5
    kinds = [e.kind for e in await live_store.events_after(run.id)]
    assert kinds == ["started", "run.cancel_requested", "run.cancelled"]


async def test_cancel_stops_a_running_tool_group(
    live_store: RunStore, db_url: str
) -> None:
    marker = "987.123"
    script = {"steps": [{"shell": ["sh", "-c", f"sleep {marker} & sleep {marker}; wait"]}]}
    queued = await live_store.enqueue("default", "acme", script, max_attempts=3)
    from runlease.agents.script import agent as script_agent

    async with running_worker(db_url, script_agent, cancel_grace_s=5, tool_kill_grace_s=2):
        await until(lambda: _async(len(processes_with(f"sleep {marker}")) >= 3),
                    what="both sleeps to start")
        asked = time.monotonic()
        await live_store.request_cancel(queued.run.id)
        run = await finished(live_store, queued.run.id)
        latency = time.monotonic() - asked
        assert processes_with(f"sleep {marker}") == []  # the sh and both sleeps
    assert (run.status, run.attempts) == ("cancelled", 1)
    assert latency < 1.5  # well inside the 2 s kill grace: SIGTERM ended the group
    print(f"cancel -> tool process group gone, run cancelled: {latency * 1000:.0f} ms")


async def test_polling_alone_completes_runs(live_store: RunStore, db_url: str) -> None:
    async with running_worker(db_url, agents.echo, listen=False, poll_interval_s=0.3) as worker:
        assert worker.listener is None
        queued = [await live_store.enqueue("default", "acme", {"i": i}) for i in range(5)]
        for q in queued:
            assert (await finished(live_store, q.run.id)).status == "done"


async def test_a_drain_releases_running_runs_without_charging(
    live_store: RunStore, db_url: str
) -> None:
    queued = await live_store.enqueue("default", "acme", {"seconds": 60}, max_attempts=1)
    async with running_worker(db_url, agents.sleepy, drain_grace_s=0.2) as worker:
        await until(lambda: _has_event(live_store, queued.run.id, "started"))
        worker.drain()
        run = await until(lambda: _status(live_store, queued.run.id, "pending", attempts=0),
                          what="the release")
    assert run.status == "pending"
    kinds = [e.kind for e in await live_store.events_after(run.id)]
    assert kinds == ["started", "run.released"]


async def _has_event(store: RunStore, run_id: UUID, kind: str) -> bool:
    return kind in [e.kind for e in await store.events_after(run_id)]


async def _async(value: Any) -> Any:
    return value


async def test_behind_pgbouncer_settings_prepared_statements_off(
    live_store: RunStore, db_url: str
) -> None:
    # Transaction-mode PgBouncer: no server-side prepared statements on the
    # pooled connections, LISTEN through its own (session or direct) URL.
    queued = [await live_store.enqueue("default", "acme", {"i": i}) for i in range(12)]
    async with running_worker(db_url, agents.echo, prepared_statements=False,
                              listen_database_url=db_url) as worker:
        for q in queued:
            assert (await finished(live_store, q.run.id)).status == "done"
        # More than psycopg's 5 executions each, yet nothing prepared anywhere.
        async with worker.store.conn_pool.connection() as conn:
            assert conn.prepare_threshold is None
            prepared = await (await conn.execute(
                "SELECT count(*) AS n FROM pg_prepared_statements")).fetchone()
            assert prepared == {"n": 0}
        assert worker.claims is not None
        assert worker.claims._db.conn is not None
        assert worker.claims._db.conn.prepare_threshold is None
        assert worker.listener is not None
        assert worker.listener.url == db_url


async def test_probes_and_metrics_of_a_worker(live_store: RunStore, db_url: str) -> None:
    import httpx

    from runlease.db.embedded import free_port

    port = free_port()
    queued = await live_store.enqueue("default", "acme", {})
    async with running_worker(db_url, agents.echo, metrics_port=port,
                              metrics_host="127.0.0.1") as worker:
        await finished(live_store, queued.run.id)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/readyz")).status_code == 200
            text = (await http.get("/metrics")).text
            assert 'runlease_runs_claimed_total{pool="default"}' in text
            assert 'runlease_runs_finished_total{outcome="done",pool="default"}' in text
            worker.draining = True  # what SIGTERM sets first: not ready any more
            ready = await http.get("/readyz")
            assert (ready.status_code, ready.text.strip()) == (503, "draining")
            worker.draining = False


async def test_acks_go_on_after_an_outage_met_an_ack_its_lost_lease_settled(
    live_store: RunStore, db_url: str
) -> None:
    # Worker._ack settles an ack as not done when the run's lease is lost or
    # fenced; the acker, retrying through an outage meanwhile, must give that
    # ack up without touching its settled future, and go on acking the others.
    store = live_store
    await store.enqueue_many("default", [NewRun("acme", {"i": i}) for i in range(2)])
    first, second = await store.claim("default", "w", 2)
    acker = Acker(store, pool="default")
    acker.start()
    try:
        with psycopg.connect(db_url, autocommit=True, application_name="test") as conn:
            terminated = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'runlease'"
            ).fetchone()
        assert terminated is not None
        assert terminated[0] >= 1  # the connection pool's connections
        settled = acker.submit(first, Rendered(None))
        settled.set_result(False)  # what a lost lease does
        acked = acker.submit(second, Rendered(None))
        assert await asyncio.wait_for(acked, 10) is True
    finally:
        await acker.stop()
    assert (await store.get(second.run_id)).status == "done"
    assert (await store.get(first.run_id)).status == "leased"  # nothing written for it
