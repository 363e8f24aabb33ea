"""Runs blocked behind busy threads and keys at their limits, loaded in bulk
as a submit leaves them (issue 27's claim target): `threads` threads each
with its head leased by a live worker and `per` runs parked behind it, and
`keys` concurrency keys at a limit of 1 each with one leased run holding its
slot and `per` runs parked for it. Their tenants have nothing else queued.
Used by tests/integration/test_thread_plans.py and bench/threads_keys.py;
imports no pytest."""

from __future__ import annotations

import psycopg

HOLDER = "blocked-holder"
TENANTS = 100


def load_blocked(url: str, pool: str, *, threads: int, keys: int, per: int) -> int:
    """Load them into `pool` (made if missing); returns how many runs wait."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO agent_run_pools (name) VALUES (%s)"
                     " ON CONFLICT (name) DO NOTHING", (pool,))
        conn.execute(
            "INSERT INTO agent_run_workers (id, pool, version, concurrency, started_at,"
            "                               heartbeat_at, expires_at)"
            " VALUES (%s, %s, 'bench', 100000, now(), now(), now() + interval '1 day')"
            " ON CONFLICT (id) DO NOTHING", (HOLDER, pool))
        # The threads' heads, leased, and their rows naming them.
        conn.execute(
            "INSERT INTO agent_runs (id, pool, tenant_id, status, fair_seq, input_json,"
            "                        attempts, lease_epoch, locked_by, thread_id, thread_seq)"
            " SELECT gen_random_uuid(), %s, 'th-' || (t %% %s), 'leased', 0, '{}', 1, 1, %s,"
            "        'thread-' || t, 1 FROM generate_series(1, %s) t",
            (pool, TENANTS, HOLDER, threads))
        conn.execute(
            "INSERT INTO agent_run_threads (tenant_id, thread_id, next_seq, head_run_id)"
            " SELECT r.tenant_id, r.thread_id, %s, r.id FROM agent_runs r"
            "  WHERE r.pool = %s AND r.thread_id IS NOT NULL AND r.status = 'leased'",
            (per + 2, pool))
        # Behind each head, `per` runs parked as thread_join parks them.
        conn.execute(
            "INSERT INTO agent_runs (id, pool, tenant_id, fair_seq, input_json, thread_id,"
            "                        thread_seq, delayed, thread_due_at, available_at)"
            " SELECT gen_random_uuid(), %s, 'th-' || (t %% %s), g, '{}', 'thread-' || t,"
            "        g + 1, true, now() - interval '1 hour', '9999-01-01 00:00:00+00'"
            "   FROM generate_series(1, %s) t, generate_series(1, %s) g",
            (pool, TENANTS, threads, per))
        # The keys: a limit of 1, one leased run holding each key's slot.
        conn.execute("INSERT INTO agent_run_key_limits (pool, key, max_in_flight)"
                     " VALUES (%s, 'key-*', 1) ON CONFLICT DO NOTHING", (pool,))
        conn.execute(
            "INSERT INTO agent_runs (id, pool, tenant_id, status, fair_seq, input_json,"
            "                        attempts, lease_epoch, locked_by, concurrency_key)"
            " SELECT gen_random_uuid(), %s, 'ky-' || (k %% %s), 'leased', 0, '{}', 1, 1, %s,"
            "        'key-' || k FROM generate_series(1, %s) k",
            (pool, TENANTS, HOLDER, keys))
        conn.execute(
            "INSERT INTO agent_runs (id, pool, tenant_id, fair_seq, input_json,"
            "                        concurrency_key, delayed, key_due_at, available_at)"
            " SELECT gen_random_uuid(), %s, 'ky-' || (k %% %s), g, '{}', 'key-' || k, true,"
            "        now() - interval '1 hour', '9999-01-01 00:00:00+00'"
            "   FROM generate_series(1, %s) k, generate_series(1, %s) g",
            (pool, TENANTS, keys, per))
        conn.execute(
            "INSERT INTO agent_run_keys (pool, tenant_id, key, active, waiting)"
            " SELECT %s, 'ky-' || (k %% %s), 'key-' || k, 1, %s"
            "   FROM generate_series(1, %s) k", (pool, TENANTS, per, keys))
    return (threads + keys) * per
