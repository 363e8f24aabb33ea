"""A busy thread's or a full key's backlog is never read per claim (issue 27, ARCHITECTURE
invariant 10 with threads): 10,000 runs queued behind one thread's active
run cost the claim nothing, and its head's finish reads one parked run to
hand the thread over. Rows read are counted from EXPLAIN ANALYZE, never timed."""

from __future__ import annotations

import psycopg
import pytest

from runlease.db.connect import make_conn_pool
from runlease.db.keys import KeyLimits
from runlease.db.models import Lease
from runlease.db.store import Conn, NewRun
from tests.support.blocked import load_blocked
from tests.support.databases import RegisteringStore
from tests.support.plans import Executed, executed, reads, seq_scans

BACKLOG = 10_000


def _queue_behind_one_thread(db_url: str, *, analyze: bool) -> None:
    """10,000 runs of thread 'busy' parked as a submit parks them (delayed,
    available_at far ahead, thread_due_at kept); the thread's head is added
    by the test, through the store."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, fair_seq, input_json, thread_id, thread_seq,"
            "                        delayed, thread_due_at, available_at)"
            " SELECT gen_random_uuid(), 'hot', g, '{}', 'busy', g + 1, true,"
            "        now() - interval '1 hour',"
            "        '9999-01-01 00:00:00+00' FROM generate_series(1, %s) g", (BACKLOG,))
        conn.execute("UPDATE agent_run_threads SET next_seq = %s"
                     " WHERE tenant_id = 'hot' AND thread_id = 'busy'", (BACKLOG + 2,))
        if analyze:
            conn.execute("ANALYZE agent_runs")


def _bounded(found: list[Executed], bound: int) -> None:
    for e in found:
        assert seq_scans(e.plan) == 0, e.text
    total = sum(reads(e.plan) for e in found)
    assert total <= bound, [(reads(e.plan), e.text[:120]) for e in found if reads(e.plan)]


@pytest.mark.parametrize("analyze", [False, True], ids=["never_analyzed", "analyzed"])
async def test_a_busy_threads_backlog_is_not_read_per_claim(
    store: RegisteringStore, db_url: str, analyze: bool
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:  # the state holds: no autoanalyze
        conn.execute("ALTER TABLE agent_runs SET (autovacuum_enabled = false)")
    async with store.connection() as conn, conn.transaction():
        head = await store.submit_to_thread("default", NewRun("hot", {}), "busy", conn=conn)
    (held,) = await store.claim("default", "holder", 5)
    assert held.run.id == head.result.run.id
    _queue_behind_one_thread(db_url, analyze=analyze)
    await store.enqueue_many("default", [NewRun(f"t{i % 5}", {}) for i in range(20)])
    async with make_conn_pool(db_url, max_size=2) as conn_pool:
        # Fresh sessions: a session's plans, made when the table was nearly
        # empty, are the core claim's concern, not the threads' (see the report).
        fresh = RegisteringStore(conn_pool, clock=store.clock)
        await _claim_and_ack(fresh, held)


async def _claim_and_ack(store: RegisteringStore, held: Lease) -> None:
    await store.incarnation("w")
    leases, found = await executed(store, lambda c: store.claim("default", "w", 10, conn=c))
    assert len(leases) == 10
    assert all(le.run.tenant_id != "hot" for le in leases)
    _bounded(found, 600)  # a few rows per tenant; the backlog is 10,000

    async def ack(conn: Conn) -> None:
        await store.ack(held, conn=conn)

    _, found = await executed(store, ack, rollback=False)
    _bounded(found, 50)  # the head's finish reads the next parked run, not the backlog
    thread = await store.get_thread("hot", "busy")
    assert thread is not None
    assert thread.head_run_id is not None
    assert thread.head_run_id != held.run.id
    nxt = await store.claim("default", "w", 50)
    hot = [le for le in nxt if le.run.tenant_id == "hot"]
    assert [le.run.id for le in hot] == [thread.head_run_id]  # one, the next in order


async def test_a_keys_parked_backlog_is_not_read_per_claim(
    store: RegisteringStore, db_url: str
) -> None:
    """The same for a concurrency key at its limit: 10,000 parked runs of
    key 'hot' cost a claim nothing; a finish hands its slot over reading one."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE agent_runs SET (autovacuum_enabled = false)")
    await store.replace_key_limits("default", KeyLimits(default=1))
    async with store.connection() as conn, conn.transaction():
        (first,) = await store.enqueue_many("default", [NewRun("hot", {})], conn=conn)
        await store.join_key(first.run.id, "hot", conn=conn)
    (held,) = await store.claim("default", "holder", 5)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, fair_seq, input_json, concurrency_key,"
            "                        delayed, key_due_at, available_at)"
            " SELECT gen_random_uuid(), 'hot', g, '{}', 'hot', true,"
            "        now() - interval '1 hour', '9999-01-01 00:00:00+00'"
            "   FROM generate_series(1, %s) g", (BACKLOG,))
    await store.enqueue_many("default", [NewRun(f"t{i % 5}", {}) for i in range(20)])
    async with make_conn_pool(db_url, max_size=2) as conn_pool:
        fresh = RegisteringStore(conn_pool, clock=store.clock)
        await fresh.incarnation("w")
        leases, found = await executed(fresh, lambda c: fresh.claim("default", "w", 10, conn=c))
        assert len(leases) == 10
        assert all(le.run.tenant_id != "hot" for le in leases)
        _bounded(found, 600)

        async def ack(conn: Conn) -> None:
            await fresh.ack(held, conn=conn)

        _, found = await executed(fresh, ack, rollback=False)
        _bounded(found, 50)
        assert await fresh.key_usage("default", "hot", "hot") == (1, BACKLOG - 1)


async def _claim_reads(db_url: str, store: RegisteringStore) -> tuple[int, list[Executed]]:
    """Rows of agent_runs one claim of 10 reads, in a fresh session (its
    plans made now), rolled back: the same claim can be measured again."""
    async with make_conn_pool(db_url, max_size=2) as conn_pool:
        fresh = RegisteringStore(conn_pool, clock=store.clock)
        await fresh.incarnation("w")
        leases, found = await executed(fresh, lambda c: fresh.claim("default", "w", 10, conn=c))
    assert len(leases) == 10
    assert {le.run.tenant_id for le in leases} <= {f"t{i}" for i in range(5)}
    for e in found:
        assert seq_scans(e.plan) == 0, e.text
    return sum(reads(e.plan) for e in found), found


@pytest.mark.parametrize("analyze", [False, True], ids=["never_analyzed", "analyzed"])
async def test_runs_behind_1000_busy_threads_and_1000_full_keys_are_not_read_per_claim(
    store: RegisteringStore, db_url: str, analyze: bool
) -> None:
    """Issue 27's claim target, counted not timed: 100,000 runs queued behind
    1,000 busy threads and 1,000 keys at their limits leave the rows a claim
    reads as they were without them; and none of them is claimable work for
    the autoscaler (startable runs, the ready counts)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE agent_runs SET (autovacuum_enabled = false)")
    await store.enqueue_many("default", [NewRun(f"t{i % 5}", {}) for i in range(40)])
    without, _ = await _claim_reads(db_url, store)
    blocked = load_blocked(db_url, "default", threads=1000, keys=1000, per=50)
    assert blocked == 100_000
    if analyze:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("ANALYZE agent_runs")
    with_backlog, found = await _claim_reads(db_url, store)
    print(f"rows of agent_runs read per claim of 10: {without} without, {with_backlog} with"
          f" {blocked:,} blocked runs")
    assert with_backlog <= without + 10, (
        without, [(reads(e.plan), e.text[:120]) for e in found if reads(e.plan)])
    assert await store.startable_runs("default") == 40
    await store.fold_counts()
    stats = await store.queue_stats("default")
    assert stats.ready == 40
    assert stats.pending == 40 + blocked  # the parked runs count as waiting (delayed)
    assert len(stats.keys_waiting) == 10  # the gauge's top keys, of 1,000 waiting
