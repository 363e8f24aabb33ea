"""The schema itself: a database migrated by an older runlease upgrades to the
schema of a fresh one, claim uses its index, heartbeats are HOT updates."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runlease.clock import ManualClock
from runlease.db.embedded import bin_dir
from runlease.db.migrate import FUNCTIONS_VERSION, functions, migrate, migrations, pending
from runlease.db.store import NewRun, RunStore
from runlease.errors import MigrationError


def schema_dump(url: str) -> str:
    out = subprocess.run(
        [str(bin_dir() / "pg_dump"), "--schema-only", "--no-owner", "--no-privileges",
         "--exclude-table=runlease_migrations", "--dbname", url],
        capture_output=True, text=True, check=True,
    ).stdout
    # pg_dump 17.6+ wraps the dump in \restrict lines with a random key.
    return "\n".join(line for line in out.splitlines() if not line.startswith(("\\restrict",
                                                                                "\\unrestrict")))


def pools(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT name, max_attempts, lease_s, default_max_in_flight, priority_aging_s,"
            " retention_s, paused, tool_env FROM agent_run_pools ORDER BY name"
        ).fetchall()


# The migrations as a10c050 released them, function bodies and all, before
# those moved to functions.sql.
OLD_MIGRATIONS = Path(__file__).resolve().parents[1] / "fixtures" / "migrations_a10c050"


def migrate_with_old_files(url: str, upto: int) -> None:
    """Migrations 1..upto applied and recorded as the runlease of a10c050 did."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE runlease_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        for path in sorted(OLD_MIGRATIONS.glob("*.sql"))[:upto]:
            sql = path.read_text(encoding="utf-8")
            with conn.transaction():
                conn.execute(sql)
                conn.execute(
                    "INSERT INTO runlease_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (int(path.name[:4]), path.stem[5:], hashlib.sha256(sql.encode()).hexdigest()))


def counts(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT pool, tenant_id, state, error_code, sum(n)::int FROM"
            " (SELECT pool, tenant_id, state, error_code, n FROM agent_run_counts"
            "  UNION ALL SELECT pool, tenant_id, state, error_code, n"
            "  FROM agent_run_count_deltas) c"
            " GROUP BY 1, 2, 3, 4 HAVING sum(n) <> 0 ORDER BY 1, 2, 3, 4").fetchall()


def test_a_fresh_database_has_the_default_pool(db_url: str) -> None:
    assert pools(db_url) == [("default", 3, 45, None, 60, 604800, False, [])]


@pytest.mark.parametrize("upto", [11, 6, 3])
def test_a_database_migrated_by_a10c050_upgrades_to_the_fresh_schema(
    db_url: str, empty_db_url: str, upto: int
) -> None:
    assert len(list(OLD_MIGRATIONS.glob("*.sql"))) == 11
    migrate_with_old_files(empty_db_url, upto)
    if upto == 6:
        # Runs waiting before 0008 are counted by 0008 and, after it, by
        # the triggers of functions.sql.
        with psycopg.connect(empty_db_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO agent_runs (id, tenant_id, input_json, delayed, available_at)"
                " SELECT gen_random_uuid(), 'acme', '{}', g > 2, now() + g * interval '1 h'"
                "   FROM generate_series(1, 5) g")
    applied = migrate(empty_db_url)
    assert [m.version for m in applied] == list(range(upto + 1, len(migrations()) + 1))
    assert schema_dump(empty_db_url) == schema_dump(db_url)
    assert pools(empty_db_url) == pools(db_url)
    assert migrate(empty_db_url) == []
    assert pending(empty_db_url) == []
    if upto == 6:
        # 0013 counts every run as 'total' too (done = total less the rest).
        assert counts(empty_db_url) == [("default", "acme", "delayed", "", 3),
                                        ("default", "acme", "pending", "", 2),
                                        ("default", "acme", "total", "", 5)]
        with psycopg.connect(empty_db_url, autocommit=True) as conn:
            conn.execute("INSERT INTO agent_runs (id, tenant_id, input_json)"
                         " VALUES (gen_random_uuid(), 'acme', '{}')")
        assert counts(empty_db_url) == [("default", "acme", "delayed", "", 3),
                                        ("default", "acme", "pending", "", 3),
                                        ("default", "acme", "total", "", 6)]


def test_a_changed_functions_file_is_applied_again(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DROP FUNCTION runlease_notify_events(uuid[], bigint[])")
        conn.execute("UPDATE runlease_migrations SET checksum = 'before' WHERE version = %s",
                      (FUNCTIONS_VERSION,))
    assert pending(db_url) == [functions()]
    assert migrate(db_url) == []
    assert pending(db_url) == []
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT runlease_notify_events('{}', '{}')").fetchone()
    assert row == (0,)


def test_migrate_check_lists_what_is_pending(empty_db_url: str) -> None:
    from click.testing import CliRunner

    from runlease.cli.server import main

    def check() -> tuple[int, list[str]]:
        result = CliRunner().invoke(main, ["migrate", "--check", "--database-url", empty_db_url])
        return result.exit_code, result.output.splitlines()

    code, lines = check()
    assert code == 1
    assert lines == [f"pending: {m.file}" for m in [*migrations(), functions()]]
    assert lines[0] == "pending: migrations/0001_initial.sql"
    assert lines[-1] == "pending: functions.sql"
    migrate(empty_db_url)
    assert check() == (0, [])


def test_a_start_with_nothing_to_apply_takes_no_table_lock(db_url: str) -> None:
    with psycopg.connect(db_url) as holder, ThreadPoolExecutor(1) as pool:
        holder.execute("LOCK TABLE agent_runs IN ACCESS EXCLUSIVE MODE")
        # Would wait for the holder (forever) if it took any lock on agent_runs.
        assert pool.submit(migrate, db_url).result(timeout=120) == []
        holder.rollback()


def test_migrate_is_idempotent_and_records_what_it_applied(empty_db_url: str) -> None:
    assert pending(empty_db_url) == [*migrations(), functions()]
    applied = migrate(empty_db_url)
    assert [m.version for m in applied] == [m.version for m in migrations()]
    assert migrate(empty_db_url) == []
    assert pending(empty_db_url) == []
    with psycopg.connect(empty_db_url) as conn:
        rows = conn.execute("SELECT version, name, checksum FROM runlease_migrations"
                            " ORDER BY version").fetchall()
    assert rows == [(m.version, m.name, m.checksum) for m in [functions(), *migrations()]]


def test_concurrent_migrators_apply_each_migration_once(empty_db_url: str) -> None:
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: migrate(empty_db_url), range(6)))
    assert sorted(len(r) for r in results) == [0] * 5 + [len(migrations())]


def test_a_changed_migration_is_refused(empty_db_url: str) -> None:
    migrate(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("UPDATE runlease_migrations SET checksum = 'x' WHERE version = 1")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(empty_db_url)


# A live worker incarnation 'w', the holder raw claims below claim as.
REGISTER_W = ("INSERT INTO agent_run_workers (id, pool, version, concurrency, runs_held,"
              " started_at, heartbeat_at, expires_at)"
              " VALUES ('w', 'default', 'test', 10, 0, now(), now(), now() + interval '1 hour')")


def claim_plans(url: str, setup: str | None = None) -> list[str]:
    """The executed plans of every statement inside one claim, via auto_explain."""
    plans: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        if setup:
            conn.execute(setup)
        conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET auto_explain.log_min_duration = 0")
        conn.execute("SET auto_explain.log_nested_statements = on")
        conn.execute("SET client_min_messages = log")
        with conn.transaction(force_rollback=True):
            conn.execute(REGISTER_W)
            rows = conn.execute("SELECT * FROM runlease_claim('default', 'w', 10, NULL)")
            assert len(rows.fetchall()) == 10
    return plans


@pytest.mark.slow
@pytest.mark.parametrize("limited", [False, True], ids=["no-limits", "tenant-limits"])
def test_claim_uses_the_partial_index_beside_200k_finished_runs(db_url: str, limited: bool) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, status, attempts, input_json, finished_at)"
            " SELECT gen_random_uuid(), 't' || (g % 50), 'done', 1, '{}', now()"
            "   FROM generate_series(1, 200000) g"
        )
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, fair_seq, input_json)"
            " SELECT gen_random_uuid(), 't' || (g % 5), g, '{}' FROM generate_series(1, 100) g"
        )
        conn.execute("VACUUM ANALYZE agent_runs")
    setup = ("INSERT INTO agent_run_tenant_limits (pool, tenant_id, max_in_flight)"
             " VALUES ('default', 't1', 2)") if limited else None
    plans = claim_plans(db_url, setup)
    locking = [p for p in plans if "LockRows" in p]
    # The places come from each tenant's line (candidates), locked by
    # primary key; each tenant's own runs by priority from its partial
    # index; nothing scans the table.
    tenants = [p for p in plans if "WITH RECURSIVE tenants" in p]
    lines = [p for p in plans if "LIMIT v_window" in p]
    places = [p for p in locking if "r.id = ANY (v_cand)" in p]
    own = [p for p in locking if "ORDER BY r.priority DESC" in p]
    assert tenants, plans
    assert lines, plans
    assert places, plans
    assert own, plans
    for plan in tenants:
        # The loose scan of tenants, one descent each.
        assert re.search(r"Index Only Scan using agent_runs_pending_(tenant|priority)_idx",
                         plan), plan
    for plan in lines:
        # Each tenant's line, from its head.
        assert "Index Scan using agent_runs_pending_tenant_idx" in plan, plan
    for plan in places:
        assert "agent_runs_pkey" in plan, plan
    for plan in own:
        assert "Index Scan using agent_runs_pending_priority_idx" in plan, plan
    assert not any("Seq Scan on agent_runs " in p for p in plans), plans


def rows_read(plan: dict[str, Any]) -> int:
    """Rows the scans of agent_runs in one executed plan returned or filtered out."""
    read = 0
    if plan.get("Relation Name") == "agent_runs":
        read += int(plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1))
        read += int(plan.get("Rows Removed by Filter", 0))
        read += int(plan.get("Rows Removed by Index Recheck", 0))
    return read + sum(rows_read(child) for child in plan.get("Plans", []))


@pytest.mark.slow
def test_claim_reads_no_capped_or_delayed_backlog(db_url: str) -> None:
    # 20 tenants at their cap with 20,000 pending runs at the head of the
    # fair order, 5,000 runs in backoff of 50 other tenants ahead of them
    # too, and a fresh tenant's 100 runs behind: a claim reads a few rows per
    # tenant, not the backlogs (the plan before: an index scan of the fair
    # order filtering out every capped or delayed run ahead of the first
    # claimable one).
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO agent_run_tenant_limits (pool, tenant_id, max_in_flight)"
            " SELECT 'default', 'capped-' || t, 1 FROM generate_series(1, 20) t")
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, status, attempts, lease_epoch, input_json,"
            "                        locked_by)"
            " SELECT gen_random_uuid(), 'capped-' || t, 'leased', 1, 1, '{}', 'elsewhere'"
            "   FROM generate_series(1, 20) t")
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, fair_seq, input_json)"
            " SELECT gen_random_uuid(), 'capped-' || (g % 20 + 1), g / 20, '{}'"
            "   FROM generate_series(0, 19999) g")
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, fair_seq, input_json, attempts, delayed,"
            "                        available_at)"
            " SELECT gen_random_uuid(), 'retrying-' || (g % 50), g / 50, '{}', 1, true,"
            "        now() + interval '1 hour' FROM generate_series(0, 4999) g")
        conn.execute(
            "INSERT INTO agent_runs (id, tenant_id, fair_seq, input_json)"
            " SELECT gen_random_uuid(), 'fresh', 500 + g, '{}' FROM generate_series(1, 100) g")
        conn.execute("VACUUM ANALYZE agent_runs")
    plans: list[dict[str, Any]] = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: plans.append(json.loads(
            (d.message_primary or "").split("plan:", 1)[1])))
        conn.execute("LOAD 'auto_explain'")
        for name, value in [("log_min_duration", "0"), ("log_nested_statements", "on"),
                            ("log_analyze", "on"), ("log_format", "json"),
                            ("log_level", "notice")]:
            conn.execute(f"SET auto_explain.{name} = {value}")
        with conn.transaction(force_rollback=True):
            conn.execute(REGISTER_W)
            rows = conn.execute(
                "SELECT tenant_id FROM runlease_claim('default', 'w', 10, NULL)"
            ).fetchall()
    assert [r[0] for r in rows] == ["fresh"] * 10
    per_statement = [rows_read(p["Plan"]) for p in plans if "Plan" in p]
    # 71 tenants: a descent or two each, plus the 10 claimed and what
    # locking and the in-flight counts read (20 leased runs).
    assert sum(per_statement) < 600, per_statement


def delayed(url: str, run_id: Any) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT delayed FROM agent_runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return bool(row[0])


async def test_runs_in_backoff_wait_outside_the_claim_indexes(
    store: RunStore, clock: ManualClock, db_url: str
) -> None:
    # A nacked run leaves the claim's indexes (delayed) and comes back when
    # its backoff is over, through the claim itself.
    await store.enqueue("default", "acme", {})
    (lease,) = await store.claim("default", "w", 1)
    await store.nack(lease, "flaky", "x")  # the first backoff is 5 s
    assert delayed(db_url, lease.run_id)
    assert await store.claim("default", "w", 1) == []
    clock.advance(4)
    assert await store.claim("default", "w", 1) == []
    assert delayed(db_url, lease.run_id)
    clock.advance(2)
    (again,) = await store.claim("default", "w", 1)
    assert (again.run_id, again.epoch) == (lease.run_id, 2)
    assert not delayed(db_url, lease.run_id)


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
async def test_fenced_writes_go_by_primary_key_among_many_leases(
    live_store: RunStore, db_url: str, plan_mode: str
) -> None:
    # Statistics taken while nothing was leased make the partial index of
    # leased runs look empty. A fenced write whose WHERE implies that index's
    # predicate would then scan every leased run of the fleet for its one row.
    store = live_store
    await store.enqueue_many("default", [NewRun("acme", {"i": i}) for i in range(600)])
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE agent_runs")
    leases = await store.claim("default", "w", 500)
    await store.request_cancel(leases[7].run_id)
    plans: list[str] = []
    async with store.connection() as conn:
        await conn.execute(f"SET plan_cache_mode = {plan_mode}")
        await conn.execute("LOAD 'auto_explain'")
        for name, value in [("log_min_duration", "0"), ("log_nested_statements", "on"),
                            ("log_level", "notice")]:
            await conn.execute(f"SET auto_explain.{name} = {value}")
        conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        await store.record_event(leases[0], "note", {}, conn=conn)
        await store.record_step(leases[0], "k", 1, conn=conn)
        await store.ack(leases[0], conn=conn)
        await store.ack_many([(lease, None) for lease in leases[1:3]], conn=conn)
        await store.nack(leases[3], "flaky", "x", conn=conn)
        await store.fail(leases[4], "broken", "x", conn=conn)
        await store.release("w", [(leases[5].run_id, leases[5].epoch)], conn=conn)
        await store.finalize_cancel(leases[7], conn=conn)
    # The statements' own reads of agent_runs (the foreign-key checks of event
    # and step inserts are alias x, by primary key by construction).
    writes = [p for p in plans if re.search(r"on agent_runs r\b", p)]
    assert len(writes) >= 8, plans
    for plan in writes:
        assert "Seq Scan on agent_runs r" not in plan, plan
        used = re.findall(r"Index Scan using (\w+) on agent_runs r\b", plan)
        # One row: by primary key, or by (holder, id) when the planner proves
        # the epoch positive (a custom plan); a cancel's finalize may start
        # from the holder's cancelled runs (a few), never from all its leases.
        assert used, plan
        assert set(used) <= {"agent_runs_pkey", "agent_runs_holder_idx",
                             "agent_runs_cancel_held_idx"}, plan
        if "agent_runs_holder_idx" in used:
            assert re.search(r"Index Cond: \(\(locked_by = .*\) AND \(id = ", plan), plan


@pytest.mark.parametrize("column", ["input_json", "budget_json"])
def test_input_and_budget_must_be_objects_when_written(db_url: str, column: str) -> None:
    # A trigger, not a CHECK (a CHECK re-detoasts the input at every
    # heartbeat): the same refusal at insert and at an update of the column.
    name = "input" if column == "input_json" else "budget"
    other = "budget_json" if column == "input_json" else "input_json"
    with psycopg.connect(db_url, autocommit=True) as conn:
        for bad in ("[]", '"text"', "1", "null"):
            with pytest.raises(psycopg.errors.CheckViolation) as refused:
                conn.execute(f"INSERT INTO agent_runs (id, tenant_id, {column}, {other})"
                             " VALUES (gen_random_uuid(), 't', %s::jsonb, '{}')", (bad,))
            assert refused.value.diag.constraint_name == f"agent_runs_{name}_is_object"
        run_id = conn.execute(f"INSERT INTO agent_runs (id, tenant_id, {column}, {other})"
                              " VALUES (gen_random_uuid(), 't', '{}', '{}') RETURNING id"
                              ).fetchone()
        assert run_id is not None
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(f"UPDATE agent_runs SET {column} = '[1]' WHERE id = %s", run_id)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(f"UPDATE agent_runs SET {column} = {column} - 'x' || '[]'"
                         " WHERE id = %s", run_id)
        conn.execute(f"UPDATE agent_runs SET {column} = '{{\"a\": 1}}' WHERE id = %s", run_id)
