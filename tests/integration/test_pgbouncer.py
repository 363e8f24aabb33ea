"""Behind a real PgBouncer in transaction pooling mode (tests/support/pgbouncer.py):
workers (LISTEN through the separate direct URL, and polling only) and the API
run through it with prepared statements off; with them on, a worker and
`runlease api` refuse to start and a statement that fails says what to change; a shortened chaos
run passes through it."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest

from runlease.client import AsyncClient, RunEnded, StreamEvent
from runlease.db.connect import make_conn_pool
from runlease.db.pooler import transaction_pooled
from runlease.db.store import RunStore
from runlease.errors import RunleaseError, SettingsError
from runlease.settings import WorkerSettings, load
from runlease.worker.worker import Worker
from tests.support import agents
from tests.support.api import serve_api
from tests.support.chaos import Chaos, ChaosConfig
from tests.support.pgbouncer import PgBouncer
from tests.support.waiting import until
from tests.support.workers import running_worker

RUNS = 40  # each statement runs more often than psycopg's prepare threshold (5)


def worker_clients(bouncer: PgBouncer, database: str) -> int:
    """PgBouncer's client connections to `database` (its admin console)."""
    with psycopg.connect(f"host=127.0.0.1 port={bouncer.port} dbname=pgbouncer user=postgres",
                         autocommit=True, prepare_threshold=None) as conn:
        cur = conn.execute("SHOW CLIENTS")
        names = [d.name for d in cur.description or []]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return sum(1 for r in rows if r["database"] == database
               and r.get("application_name") == "runlease-worker")


async def all_done(store: RunStore, ids: list[UUID], timeout_s: float = 60) -> None:
    async def probe() -> bool:
        runs = [await store.get(i) for i in ids]
        return all(r.status == "done" for r in runs)

    await until(probe, timeout_s=timeout_s, what=f"{len(ids)} runs to be done")


async def test_the_bouncer_is_seen_as_transaction_pooled_and_the_server_is_not(
        db_url: str, bouncer_url: str) -> None:
    assert await transaction_pooled(bouncer_url)
    assert not await transaction_pooled(db_url)


@pytest.mark.parametrize("listen", [True, False], ids=["listen-direct", "polling-only"])
async def test_a_worker_through_pgbouncer_completes_runs(
        db_url: str, bouncer_url: str, pgbouncer: PgBouncer, listen: bool) -> None:
    # LISTEN goes through the direct URL; with it, claims wait for NOTIFY
    # (a long poll interval), so the runs finishing shows it was delivered.
    settings: dict[str, Any] = (
        {"listen_database_url": db_url, "poll_interval_s": 120} if listen
        else {"listen": False, "poll_interval_s": 0.2})
    async with make_conn_pool(bouncer_url, max_size=4, prepare=False) as pool:
        store = RunStore(pool)
        async with running_worker(bouncer_url, agents.echo, concurrency=4,
                                  prepared_statements=False, **settings) as worker:
            assert (worker.listener is not None) == listen
            ids = [(await store.enqueue("default", "acme", {"i": i})).run.id
                   for i in range(RUNS)]
            await all_done(store, ids)
            database = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
            assert worker_clients(pgbouncer, str(database)) >= 1  # it did go through
    async with make_conn_pool(db_url, max_size=2) as direct:
        for run_id in ids:
            run = await RunStore(direct).get(run_id)
            assert (run.status, run.attempts) == ("done", 1)
            assert run.result_json == {"input": {"i": ids.index(run_id)}, "attempt": 1}


async def test_a_worker_with_prepared_statements_behind_pgbouncer_refuses_to_start(
        bouncer_url: str) -> None:
    settings = load(WorkerSettings, {"agent": "tests.support.agents:echo",
                                     "database_url": bouncer_url, "metrics_port": 0,
                                     "lease_s": 6, "heartbeat_interval_s": 1},
                    environ={})
    worker = Worker(settings, agent=agents.echo, identity="prepared-probe",
                    handle_signals=False, seal_environ=False)
    with pytest.raises(SettingsError) as raised:
        await asyncio.wait_for(worker.run(), 30)
    assert "RUNLEASE_PREPARED_STATEMENTS=false" in str(raised.value)
    assert "transaction pooled" in str(raised.value)


async def test_a_worker_listening_through_pgbouncer_warns_and_still_polls(
        bouncer_url: str, caplog: pytest.LogCaptureFixture) -> None:
    async with make_conn_pool(bouncer_url, max_size=2, prepare=False) as pool:
        store = RunStore(pool)
        with caplog.at_level(logging.WARNING, logger="runlease.db.pooler"):
            async with running_worker(bouncer_url, agents.echo, prepared_statements=False,
                                      poll_interval_s=0.2):
                ids = [(await store.enqueue("default", "acme", {})).run.id for _ in range(3)]
                await all_done(store, ids)
    assert "listen_through_pooler" in caplog.text
    assert "RUNLEASE_LISTEN_DATABASE_URL" in caplog.text


async def test_a_direct_url_gives_no_pooler_warning(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="runlease.db.pooler"):
        async with running_worker(db_url, agents.echo):
            pass
    assert "pooler" not in caplog.text


async def test_prepared_statements_through_pgbouncer_work_or_fail_clearly(
        bouncer_url: str) -> None:
    # Two pools' connections share the bouncer's server connections: each
    # prepares psycopg's _pg3_0, _pg3_1... after 5 runs of a statement.
    failures: list[RunleaseError] = []
    async with make_conn_pool(bouncer_url, max_size=3, prepare=True) as one, \
            make_conn_pool(bouncer_url, max_size=3, prepare=True) as two:
        async def submit(store: RunStore, n: int) -> None:
            for i in range(n):
                try:
                    queued = await store.enqueue("default", "acme", {"i": i})
                    await store.get(queued.run.id)
                except RunleaseError as exc:
                    failures.append(exc)

        await asyncio.gather(*(submit(RunStore(p), 20) for p in (one, two, one, two)))
    # This PgBouncer (Debian's 1.18) cannot route them: then every failure says why.
    assert failures, "expected a PgBouncer without prepared-statement support"
    for exc in failures:
        assert "prepared statement" in str(exc)
        assert "--no-prepared-statements" in str(exc)


async def test_the_api_with_prepared_statements_through_pgbouncer_fails_clearly(
        bouncer_url: str, caplog: pytest.LogCaptureFixture) -> None:
    statuses: list[int] = []
    async with serve_api(bouncer_url) as api, httpx.AsyncClient(
            base_url=api.url, headers=api.headers("acme"), timeout=30) as http:
        async def client(n: int) -> None:
            for i in range(n):
                r = await http.post("/v1/runs", json={"input": {"i": i}})
                statuses.append(r.status_code)
                if r.status_code == 201:
                    statuses.append((await http.get(f"/v1/runs/{r.json()['id']}")).status_code)

        await asyncio.gather(*(client(15) for _ in range(6)))
    failed = [s for s in statuses if s not in (200, 201)]
    # This PgBouncer cannot route them; a tenant sees a plain 500 (nothing of
    # the database's words), the operator's log says what to change.
    assert failed, "expected a PgBouncer without prepared-statement support"
    assert set(failed) == {500}
    assert "--no-prepared-statements" in caplog.text


def test_runlease_api_with_prepared_statements_behind_pgbouncer_refuses_to_start(
        bouncer_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLEASE_")}
    done = subprocess.run(
        [sys.executable, "-m", "runlease", "api", "--database-url", bouncer_url,
         "--port", "0", "--tokens", "acme=tok-acme-0123456789"],
        env=env | {"DATABASE_URL": ""}, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "transaction pooled" in done.stderr
    assert "--no-prepared-statements" in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_api_through_pgbouncer_submits_gets_and_streams(
        db_url: str, bouncer_url: str) -> None:
    steps: list[dict[str, Any]] = []
    for i in range(3):
        steps += [{"emit": {"i": i}}, {"sleep": 0.05}]
    async with serve_api(bouncer_url, listen_database_url=db_url,
                         prepared_statements=False) as api, \
            AsyncClient(api.url, api.token("acme")) as client, \
            running_worker(bouncer_url, listen_database_url=db_url, prepared_statements=False):
        runs = [await client.submit({"steps": steps}) for _ in range(8)]
        for run in runs:  # the API's statements, each well past the prepare threshold
            items = [item async for item in client.events(run.id)]
            assert [e.seq for e in items if isinstance(e, StreamEvent)] == [1, 2, 3]
            assert items[-1] == RunEnded("done", None, 1)
            final = await client.get(run.id)
            assert (final.status, final.result) == ("done", {"steps": 6})
        # Tenant-scoped through the bouncer too.
        assert {r.id for r in (await client.list()).items} == {r.id for r in runs}
        async with AsyncClient(api.url, api.token("globex")) as other:
            assert (await other.list()).items == []


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_chaos_through_pgbouncer(tmp_path: Path) -> None:
    config = ChaosConfig(runs=60, chaos_s=20, db_restarts=1, stop_mode="immediate",
                         pgbouncer=True, followers=2)
    f = Chaos(config, tmp_path).run()
    print("chaos figures: " + ", ".join(f"{k}={v}" for k, v in f.table()))
    print(f"details: {f.details}")
    assert f.kills >= 3
    assert f.db_restarts == 1
    assert f.submitted == config.runs
    assert f.lost == 0, f.details["statuses"]
    assert f.done == config.runs
    assert f.attempts_over_max == 0
    assert f.event_seq_gaps == 0
    assert f.orphaned_tools == 0, f.details["orphans"]
    assert f.overlapping_leases == 0, f.details["overlaps"]
    assert f.streams_broken == 0, f.details["streams_broken"]
    assert f.worker_exits == 0, f.details.get("worker_exit_logs")
    # PgBouncer refuses clients for server_login_retry (1 s here) after a failed
    # server login, so requests just after the restart may still be refused:
    # as 503s that say so, never as another error.
    assert all("503 database_unavailable" in error
               for _, error in f.details["api_errors_after_restart"]), f.details
