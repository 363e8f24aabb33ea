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


-- name: console_run_timeline
-- What a run's timeline draws besides its holders and lifecycle events: the
-- database's now (the end of a run still running), when each durable step
-- committed, and its tool calls' events (what of their data times them:
-- never arguments, results or output). Bounded; the run's own rows only.
SELECT 'now' AS what, NULL::text AS key, NULL::jsonb AS data,
       coalesce(%(now)s::timestamptz, now()) AS at
UNION ALL
(SELECT 'step', s.step_key, jsonb_build_object('attempt', s.attempt), s.created_at
   FROM agent_run_steps s
  WHERE s.run_id = %(id)s
  ORDER BY s.created_at, s.step_key
  LIMIT %(limit)s)
UNION ALL
(SELECT e.kind, e.seq::text,
        jsonb_strip_nulls(jsonb_build_object(
            'id', e.data -> 'id', 'name', e.data -> 'name', 'step', e.data -> 'step',
            'duration_s', e.data -> 'duration_s', 'returncode', e.data -> 'returncode')),
        e.created_at
   FROM agent_run_events e
  WHERE e.run_id = %(id)s AND e.kind IN ('tool.call', 'tool.result', 'tool.exit')
  ORDER BY e.seq
  LIMIT %(limit)s);


-- name: console_usage
-- Usage per UTC day, tenant and pool between two days (inclusive), read as
-- usage_report reads it ({{usage_rows}}); bounded.
WITH {{usage_rows}}
SELECT r.day, r.tenant_id, r.pool,
       sum(r.input_tokens)::bigint AS input_tokens,
       sum(r.output_tokens)::bigint AS output_tokens,
       sum(r.cost) AS cost, sum(r.records)::bigint AS records
  FROM rows r
 GROUP BY r.day, r.tenant_id, r.pool
 ORDER BY r.day DESC, r.tenant_id, r.pool
 LIMIT %(limit)s;
