-- Reads for the web console (api/console/): bounded, tenant-scoped.


-- name: console_status_counts
-- Runs per counted state over all runs of the scope (a tenant, a pool, both
-- or neither), from the maintained counts (agent_run_counts plus the deltas
-- not folded yet) and the leased runs from agent_runs_leased_idx (bounded
-- by what is in flight): one snapshot, so done = total less the others is
-- exact. Reads one row per (pool, tenant, state), never the runs.
WITH counted AS (
    SELECT c.state, c.n FROM agent_run_counts c
     WHERE (%(tenant)s::text IS NULL OR c.tenant_id = %(tenant)s::text)
       AND (%(pool)s::text IS NULL OR c.pool = %(pool)s::text)
    UNION ALL
    SELECT d.state, d.n FROM agent_run_count_deltas d
     WHERE (%(tenant)s::text IS NULL OR d.tenant_id = %(tenant)s::text)
       AND (%(pool)s::text IS NULL OR d.pool = %(pool)s::text)
)
SELECT c.state, sum(c.n)::bigint AS n FROM counted c GROUP BY c.state
UNION ALL
SELECT 'leased', count(*)
  FROM agent_runs r
 WHERE r.status = 'leased'
   AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)
   AND (%(pool)s::text IS NULL OR r.pool = %(pool)s::text);


-- name: console_runs_by_key
-- Runs with this idempotency key, any pool: one probe of the idempotency
-- index per pool.
SELECT r.*
  FROM agent_run_pools p
  JOIN agent_runs r ON r.pool = p.name AND r.idempotency_key = %(key)s
 WHERE (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)
 ORDER BY r.id DESC
 LIMIT %(limit)s;


-- name: console_run_holders
-- Who held each of the run's leases (the claim appends to holders).
SELECT holders FROM agent_runs WHERE id = %(id)s;


-- name: console_run_lifecycle
-- A run's lifecycle events (run.*: retrying, dead, lease_expired, released,
-- cancel_requested, cancelled, redriven), newest last, bounded.
SELECT seq, kind, data, created_at
  FROM agent_run_events
 WHERE run_id = %(id)s AND kind LIKE 'run.%%'
 ORDER BY seq DESC
 LIMIT %(limit)s;


-- name: console_signout_add
-- A session signed out: its nonce is refused until the cookie's own expiry;
-- the rows past theirs go at the same time (a few, bounded by sign-outs).
WITH gone AS (
    DELETE FROM runlease_console_signouts
     WHERE nonce IN (SELECT nonce FROM runlease_console_signouts
                      WHERE expires_at < now() LIMIT 100)
)
INSERT INTO runlease_console_signouts (nonce, expires_at)
VALUES (%(nonce)s, to_timestamp(%(expires)s))
    ON CONFLICT (nonce) DO NOTHING;


-- name: console_signed_out
SELECT EXISTS (SELECT 1 FROM runlease_console_signouts WHERE nonce = %(nonce)s) AS out;
