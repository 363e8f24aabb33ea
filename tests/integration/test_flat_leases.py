"""Costs flat in live leases (invariant 10): the reaper reads the leases of
expired workers only, retention only what it deletes, and a heartbeat
renews one row of its worker whatever the leases it holds (the lease is the
incarnation's), even as a generic plan. Rows read are counted from EXPLAIN ANALYZE (through
auto_explain), never timed."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from runlease.db.store import Conn, NewRun, Registration, RunStore


def reads(plan: dict[str, Any], relation: str = "agent_runs") -> int:
    """Rows the scans of `relation` in one executed plan returned or filtered out."""
    n = 0
    if plan.get("Relation Name") == relation:
        n += int(plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1))
        n += int(plan.get("Rows Removed by Filter", 0))
        n += int(plan.get("Rows Removed by Index Recheck", 0))
    return n + sum(reads(child, relation) for child in plan.get("Plans", []))


def work(plan: dict[str, Any]) -> int:
    """Rows every node of a plan produced or threw away, all loops counted."""
    n = int(plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1))
    n += int(plan.get("Rows Removed by Filter", 0))
    n += int(plan.get("Rows Removed by Join Filter", 0))
    return n + sum(work(child) for child in plan.get("Plans", []))


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in nodes(child))]


async def explained(store: RunStore, call: Callable[[Conn], Awaitable[Any]],
                    setup: str | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """What `call` returned, and the executed plans of its statements."""
    plans: list[dict[str, Any]] = []
    async with store.connection() as conn:
        await conn.set_autocommit(True)
        if setup:
            await conn.execute(setup)  # type: ignore[arg-type]
        await conn.execute("LOAD 'auto_explain'")
        for name, value in [("log_min_duration", "0"), ("log_analyze", "on"),
                            ("log_format", "json"), ("log_level", "notice")]:
            await conn.execute(f"SET auto_explain.{name} = {value}")  # type: ignore[arg-type]
        conn.add_notice_handler(lambda d: plans.append(json.loads(
            (d.message_primary or "").split("plan:", 1)[1])["Plan"])
            if "plan:" in (d.message_primary or "") else None)
        try:
            result = await call(conn)
        finally:
            await conn.execute("RESET ALL")
            await conn.execute("LOAD 'auto_explain'")
            await conn.execute("SET auto_explain.log_min_duration = -1")
    return result, plans


def add_leases(db_url: str, n: int, *, holder: str, first: int = 0,
               old_ids: bool = False) -> None:
    """n leased runs held by `holder` (whose row says whether they are live);
    ids two hours old with old_ids (the worst case for a retention bounded
    by id)."""
    ident = ("(lpad(to_hex((extract(epoch FROM now() - interval '2 hours') * 1000)::bigint),"
             " 12, '0') || '7000' || '8' || lpad(to_hex(i), 15, '0'))::uuid"
             if old_ids else "gen_random_uuid()")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO agent_runs (id, tenant_id, status, input_json, attempts, lease_epoch,"
            f"                        locked_by)"
            f" SELECT {ident}, 't' || (i %% 20), 'leased', '{{}}', 1, 1, %s"
            f"   FROM generate_series(%s::integer, %s::integer) i",
            (holder, first + 1, first + n))
        conn.execute("VACUUM ANALYZE agent_runs")


async def register_live(store: RunStore, workers: int) -> None:
    for w in range(workers):
        await store.register_worker(Registration(f"live-{w}", "default", 100), lease_s=600)


@pytest.mark.slow
async def test_reap_reads_the_leases_of_expired_workers_only(
    live_store: RunStore, db_url: str
) -> None:
    store = live_store
    await register_live(store, 10)
    # A worker whose row expired, and one that never registered: 30 expired
    # leases between them, reaped in one pass.
    await store.register_worker(Registration("gone", "default", 10), lease_s=1)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE agent_run_workers SET expires_at = now() - interval '1 minute'"
                     " WHERE id = 'gone'")
    read: list[int] = []
    for round_, live in enumerate((2_000, 8_000)):
        for w in range(10):
            add_leases(db_url, live // 10, holder=f"live-{w}",
                       first=round_ * 100_000 + w * 10_000)
        add_leases(db_url, 20, holder="gone", first=900_000 + round_ * 100)
        add_leases(db_url, 10, holder="ghost", first=950_000 + round_ * 100)
        result, plans = await explained(store, lambda c: store.reap(batch=1000, conn=c))
        assert (result.to_pending, len(result.reaped)) == (30, 30)
        # Ended in the first pass; its later runs are reaped as those of a
        # holder that can never renew.
        assert result.ended == (("gone",) if round_ == 0 else ())
        (plan,) = plans
        scans = {n.get("Index Name") for n in nodes(plan)
                 if n.get("Relation Name") == "agent_runs"}
        assert "agent_runs_holder_idx" in scans, scans
        assert not any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "agent_runs"
                       for n in nodes(plan))
        read.append(reads(plan))
    # 2,000 then 10,000 live leases: the same reads (11 holders' descents,
    # the 30 expired leases, their re-check by primary key).
    assert read[0] < 200, read
    assert read[1] <= read[0] + 10, read


@pytest.mark.slow
@pytest.mark.parametrize("statement", ["by_pool", "purge"])
async def test_retention_reads_only_what_it_deletes(
    live_store: RunStore, db_url: str, statement: str
) -> None:
    store = live_store
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE agent_run_pools SET retention_s = 3600")
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, status, input_json, attempts, finished_at)"
            " SELECT gen_random_uuid(), 't', 'done', '{}', 1,"
            "        now() - interval '1 minute' * g FROM generate_series(1, 200) g")
    read: list[int] = []
    for round_, live in enumerate((2_000, 8_000)):
        # Live leases whose ids are older than the cutoff: the old plan
        # walked the primary key below the cutoff's id through all of them.
        add_leases(db_url, live, holder="w", first=round_ * 100_000, old_ids=True)

        async def delete(c: Conn) -> int:
            if statement == "by_pool":
                return sum((await store.delete_expired(batch=50, conn=c)).values())
            return await store.delete_finished(3600, batch=50, conn=c)

        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO agent_runs (id, tenant_id, status, input_json, attempts,"
                "                        finished_at)"
                " SELECT gen_random_uuid(), 't', 'done', '{}', 1,"
                "        now() - interval '2 hours' - interval '1 second' * g"
                "   FROM generate_series(1, 60) g")
        deleted, plans = await explained(store, delete)
        assert deleted == 50
        plan = plans[-1]
        assert "agent_runs_finished_idx" in {n.get("Index Name") for n in nodes(plan)}
        read.append(reads(plan))
    assert read[0] < 200, read
    assert read[1] <= read[0] + 10, read


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
async def test_a_heartbeat_is_one_row_whatever_the_leases_it_renews(
    live_store: RunStore, db_url: str, plan_mode: str
) -> None:
    # One worker holding 1,000 leases, five of them asked to stop, beside
    # another holding 1,000 with cancels of its own: its heartbeat renews its
    # one row and reads its five cancels from their partial index, as a
    # generic plan too (past the custom plans of a prepared statement).
    store = live_store
    await store.enqueue_many("default", [NewRun("acme", {}) for _ in range(2000)])
    mine = await store.claim("default", "w", 1000)
    theirs = await store.claim("default", "other", 1000)
    for lease in mine[:5] + theirs[:50]:
        await store.request_cancel(lease.run_id)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE agent_runs")

    async def beats(conn: Conn) -> Any:
        renewal = None
        for _ in range(7):
            renewal = await store.heartbeat(Registration("w", "default", 1000), lease_s=30,
                                            runs_held=1000, conn=conn)
        return renewal

    renewal, plans = await explained(store, beats, f"SET plan_cache_mode = {plan_mode}")
    assert renewal is not None
    assert renewal.cancel_requested == {lease.run_id for lease in mine[:5]}
    plan = plans[-1]
    assert reads(plan, "agent_run_workers") <= 2, plan  # its row, found and updated
    assert reads(plan) == 5, plan
    assert work(plan) < 50, work(plan)


def table_writes(db_url: str, table: str) -> tuple[int, int]:
    """(updates, HOT updates) of a table so far."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                           " WHERE relname = %s", (table,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_heartbeats_write_no_run_and_renew_their_row_in_place(
    live_store: RunStore, db_url: str
) -> None:
    # 100 heartbeats of a worker holding 1,000 leases: 100 HOT updates of its
    # one row, not 100,000 of run rows.
    store = live_store
    await store.enqueue_many("default", [NewRun("acme", {"i": i}) for i in range(1000)])
    async with store.connection() as conn:
        await conn.set_autocommit(True)
        for _ in range(20):  # as a worker claims: in batches
            await store.claim("default", "w", 50, conn=conn)
        await conn.execute("SELECT pg_stat_force_next_flush()")
        runs_before = table_writes(db_url, "agent_runs")
        workers_before = table_writes(db_url, "agent_run_workers")
        for _ in range(100):
            assert await store.heartbeat(Registration("w", "default", 1000), lease_s=30,
                                         runs_held=1000, conn=conn) is not None
        await conn.execute("SELECT pg_stat_force_next_flush()")
        runs_after = table_writes(db_url, "agent_runs")
        workers_after = table_writes(db_url, "agent_run_workers")
    assert runs_after == runs_before
    updates = workers_after[0] - workers_before[0]
    hot = workers_after[1] - workers_before[1]
    assert updates == 100
    assert hot >= 95, (hot, updates)
