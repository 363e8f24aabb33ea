"""Plans that hold without fresh statistics (issue 26): each stage of the
claim, the ack, the heartbeat, the reap and the queue counts keep their
intended plans whatever pg_statistic says about agent_runs, in the three
states a burst of runs meets in production:

- analyzed_empty: the pool sat idle and autovacuum analyzed the table with
  nothing pending;
- never_analyzed: a table created (or truncated) and never analyzed;
- million_done: analyzed with 1,000,000 finished runs and nothing pending.

Then a burst arrives (20,000 ready runs of 10 tenants, 200 whose backoff has
ended, leases of live and dead workers) and no ANALYZE runs (autovacuum is
off for the table here, so the state holds for the whole module). A bad plan
reads the burst (every pending run of the pool, per statement: 689,741 rows
for one claim of 10 runs, measured without the fix); the intended ones read a few rows
per tenant. Rows read are counted from EXPLAIN ANALYZE, never timed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

from runlease.db.connect import make_conn_pool
from runlease.db.models import Lease
from runlease.db.store import Conn, Registration
from tests.support.databases import RegisteringStore, _create_db, _drop_db, with_dbname
from tests.support.plans import Executed, executed, indexes, reads, seq_scans

pytestmark = pytest.mark.timeout(300)

STATES = ["analyzed_empty", "never_analyzed", "million_done"]
TENANTS = 10
READY = 20_000
# Every claim statement together, for 10 runs among 10 tenants: a few rows
# per tenant (the loose scan, each line's head, the locks), never the burst.
CLAIM_READS = 1_200
WAITING = 30_000  # runs waiting for a person's input: read by nothing but their own
DUE_INPUTS = 50  # of them, requests whose time is up


def _prepare(url: str, state: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE agent_runs SET (autovacuum_enabled = false)")
        if state == "analyzed_empty":
            conn.execute("VACUUM ANALYZE agent_runs")
        elif state == "million_done":
            conn.execute(
                "INSERT INTO agent_runs (id, tenant_id, status, attempts, input_json,"
                "                        finished_at)"
                " SELECT gen_random_uuid(), 't' || (g % 50), 'done', 1, '{}',"
                "        now() - interval '1 second' * g"
                "   FROM generate_series(1, 1000000) g")
            conn.execute("VACUUM ANALYZE agent_runs")
        else:
            (analyzed,) = conn.execute(
                "SELECT last_analyze IS NULL AND last_autoanalyze IS NULL"
                "  FROM pg_stat_user_tables WHERE relname = 'agent_runs'").fetchone() or (None,)
            assert analyzed, "the template's agent_runs was analyzed"
        # The burst, and no ANALYZE after it.
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, fair_seq, input_json)"
            " SELECT gen_random_uuid(), 't' || (g %% %s), g, '{}'"
            "   FROM generate_series(1, %s) g", (TENANTS, READY))
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, fair_seq, input_json, attempts, delayed,"
            "                        available_at)"
            " SELECT gen_random_uuid(), 't' || (g % 50), 10000 + g, '{}', 1, true,"
            "        now() - interval '1 minute' FROM generate_series(1, 200) g")
        conn.execute(
            "INSERT INTO agent_run_tenant_limits (pool, tenant_id, max_in_flight)"
            " SELECT 'default', 't' || t, 3 FROM generate_series(0, 4) t")
        conn.execute(
            "INSERT INTO agent_run_workers (id, pool, version, concurrency, runs_held,"
            "                               started_at, heartbeat_at, expires_at)"
            " VALUES ('w-live', 'default', 'test', 100, 100, now(), now(),"
            "         now() + interval '1 hour'),"
            "        ('w-gone', 'default', 'test', 20, 20, now() - interval '1 hour',"
            "         now() - interval '1 hour', now() - interval '1 minute')")
        # Waiting for people (issue 28, invariant 10): 30,000 runs with
        # requests that time out later or never, and 50 whose time is up.
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, status, attempts, lease_epoch, input_json)"
            " SELECT gen_random_uuid(), 't' || (g %% 10), 'waiting', 0, 1, '{}'"
            "   FROM generate_series(1, %s) g", (WAITING + DUE_INPUTS,))
        conn.execute(
            "INSERT INTO agent_run_inputs (run_id, name, requested_at, timeout_at, nonce)"
            " SELECT r.id, 'approve', now(),"
            "        CASE WHEN row_number() OVER () <= %s THEN now() - interval '1 minute'"
            "             WHEN row_number() OVER () %% 3 = 0 THEN NULL"
            "             ELSE now() + interval '1 day' END, md5(r.id::text)"
            "   FROM agent_runs r WHERE r.status = 'waiting'", (DUE_INPUTS,))
        for holder, n in (("w-live", 100), ("w-gone", 20), ("ghost", 10)):
            conn.execute(
                "INSERT INTO agent_runs (id, tenant_id, status, attempts, lease_epoch,"
                "                        input_json, locked_by, cancel_requested_at)"
                " SELECT gen_random_uuid(), 't' || (g %% 10), 'leased', 1, 1, '{}', %s,"
                "        CASE WHEN g <= 5 THEN now() END"
                "   FROM generate_series(1, %s) g", (holder, n))


@pytest.fixture(scope="module", params=STATES)
def stale_db(request: pytest.FixtureRequest, server_url: str, template_db: str
             ) -> Iterator[tuple[str, str]]:
    name = _create_db(server_url, template_db)
    try:
        url = with_dbname(server_url, name)
        _prepare(url, request.param)
        yield request.param, url
    finally:
        _drop_db(server_url, name)


@pytest.fixture
async def stale_store(stale_db: tuple[str, str]) -> AsyncIterator[RegisteringStore]:
    conn_pool = make_conn_pool(stale_db[1], max_size=2)
    await conn_pool.open()
    try:
        yield RegisteringStore(conn_pool)
    finally:
        await conn_pool.close()


def _no_backlog_read(found: list[Executed], bound: int) -> None:
    for e in found:
        assert seq_scans(e.plan) == 0, e.text
    total = sum(reads(e.plan) for e in found)
    assert total <= bound, [(reads(e.plan), e.text[:120]) for e in found]


def _stage(found: list[Executed], marker: str) -> list[Executed]:
    picked = [e for e in found if marker in e.text]
    assert picked, f"no statement with {marker!r} among {[e.text[:80] for e in found]}"
    return picked


async def _fresh_worker(store: RegisteringStore) -> str:
    worker = f"claimer-{uuid.uuid4().hex[:8]}"
    await store.incarnation(worker, lease_s=600)
    return worker


async def test_each_stage_of_the_claim_keeps_its_plan(stale_store: RegisteringStore) -> None:
    store = stale_store
    worker = await _fresh_worker(store)
    leases, found = await executed(store, lambda c: store.claim("default", worker, 10, conn=c))
    assert len(leases) == 10
    _no_backlog_read(found, CLAIM_READS)
    # promote: the runs whose backoff ended, from their own index.
    for e in _stage(found, "d.delayed"):
        assert indexes(e.plan) == {"agent_runs_delayed_idx"}, e.text
    # tenants: the loose scan, one descent per tenant.
    for e in _stage(found, "WITH RECURSIVE tenants"):
        assert indexes(e.plan) <= {"agent_runs_pending_tenant_idx",
                                   "agent_runs_pending_priority_idx"}, indexes(e.plan)
        assert reads(e.plan) <= 10 * TENANTS, reads(e.plan)
    # places: each tenant's line from its head, then locks by primary key.
    for e in _stage(found, "WITH kth AS"):
        assert indexes(e.plan) == {"agent_runs_pending_tenant_idx"}, indexes(e.plan)
    for e in _stage(found, "r.id = ANY (v_cand)"):
        assert indexes(e.plan) == {"agent_runs_pkey"}, indexes(e.plan)
    # recount: the capped tenants' leases, from the index of leased runs.
    for e in _stage(found, "SELECT d.tenant_id"):
        assert "agent_runs_pending_tenant_idx" not in indexes(e.plan)
    # fill: each tenant's own priority order.
    for e in _stage(found, "ORDER BY r.priority DESC"):
        assert "agent_runs_pending_priority_idx" in indexes(e.plan), indexes(e.plan)
        assert "agent_runs_ready_idx" not in indexes(e.plan)
    # lease: by primary key.
    for e in _stage(found, "SET status = 'leased'"):
        assert indexes(e.plan) <= {"agent_runs_pkey"}, indexes(e.plan)


async def test_the_ack_goes_by_primary_key(stale_store: RegisteringStore) -> None:
    store = stale_store
    worker = await _fresh_worker(store)
    held: list[Lease] = []

    async def claim(conn: Conn) -> None:
        held.extend(await store.claim("default", worker, 5, conn=conn))

    async def ack(conn: Conn) -> Any:
        await store.ack(held[0], {"ok": True}, conn=conn)
        return await store.ack_many([(lease, None) for lease in held[1:]], conn=conn)

    lost, found = await executed(store, ack, before=claim)
    assert lost == set()
    _no_backlog_read(found, 50)
    # By primary key, or by (holder, id) when the planner proves the
    # epoch positive: one row each way.
    for e in found:
        assert indexes(e.plan) <= {"agent_runs_pkey", "agent_runs_holder_idx"}, (
            indexes(e.plan), e.text[:200])


async def test_the_heartbeat_renews_one_row(stale_store: RegisteringStore) -> None:
    store = stale_store
    renewal, found = await executed(store, lambda c: store.heartbeat(
        Registration("w-live", "default", 100), lease_s=600, runs_held=100, conn=c))
    assert renewal is not None
    assert len(renewal.cancel_requested) == 5
    _no_backlog_read(found, 10)
    assert all(reads(e.plan, "agent_run_workers") <= 1 for e in found)


async def test_the_reap_reads_the_dead_holders_runs_only(stale_store: RegisteringStore) -> None:
    store = stale_store
    result, found = await executed(store, lambda c: store.reap(conn=c))
    assert result.total >= 30  # w-gone's 20 and ghost's 10
    assert "w-gone" in result.ended
    # A descent per holder, the dead holders' runs twice (found, re-checked).
    _no_backlog_read(found, 200)
    for e in found:
        assert indexes(e.plan) <= {"agent_runs_holder_idx", "agent_runs_pkey"}, indexes(e.plan)


async def test_the_queue_counts_read_no_backlog(stale_store: RegisteringStore) -> None:
    store = stale_store
    stats, found = await executed(store, lambda c: store.queue_stats("default", conn=c))
    assert sum(pending for pending, _, _ in stats.by_tenant.values()) >= READY
    # The counts come from agent_run_counts; agent_runs gives the leases
    # (bounded by what is in flight), the due backoffs and the oldest wait.
    _no_backlog_read(found, 200 + 130 + 20)


async def test_an_enqueue_reads_its_lanes_heads_only(stale_store: RegisteringStore) -> None:
    from runlease.db.store import NewRun

    store = stale_store
    batch = [NewRun(f"t{i % 3}", {"i": i}) for i in range(300)]
    results, found = await executed(store, lambda c: store.enqueue_many(
        "default", batch, notify=False, conn=c))
    assert len(results) == 300
    # Three lanes: each its tenant's line end and the pool's head, a descent each.
    _no_backlog_read(found, 50)



async def test_the_input_timeouts_read_the_due_requests_only(
    stale_store: RegisteringStore
) -> None:
    timed_out, found = await executed(stale_store, lambda c: stale_store.time_out_inputs(
        batch=1000, conn=c))
    assert len(timed_out) == DUE_INPUTS
    for e in found:
        assert seq_scans(e.plan, "agent_run_inputs") == 0, e.text
        assert seq_scans(e.plan) == 0, e.text
    # The due requests (read, then their runs locked by primary key), never
    # the 30,000 that wait on.
    assert sum(reads(e.plan, "agent_run_inputs") for e in found) <= 3 * DUE_INPUTS
    assert sum(reads(e.plan) for e in found) <= 5 * DUE_INPUTS  # locked, updated: by pkey
