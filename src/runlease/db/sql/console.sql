-- Reads for the web console (api/console/): bounded, tenant-scoped.


-- name: console_status_counts
-- Runs per status, each count stopping at %(cap)s + 1 so a poll of the runs
-- page costs a bounded read however large the table grows (the page shows
-- "1000+"). pending, leased and dead read their partial indexes.
SELECT s.status,
       (SELECT count(*) FROM (
            SELECT 1 FROM agent_runs r
             WHERE r.status = s.status
               AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)
               AND (%(pool)s::text IS NULL OR r.pool = %(pool)s::text)
             LIMIT %(cap)s + 1) c) AS n
  FROM unnest(ARRAY['pending', 'leased', 'done', 'dead', 'cancelled']) AS s (status);


-- name: console_runs_by_key
-- Runs with this idempotency key, any pool: one probe of the idempotency
-- index per pool.
SELECT r.*
  FROM agent_run_pools p
  JOIN agent_runs r ON r.pool = p.name AND r.idempotency_key = %(key)s
 WHERE (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)
 ORDER BY r.id DESC
 LIMIT %(limit)s;


-- name: console_run_lifecycle
-- A run's lifecycle events (run.*: retrying, dead, lease_expired, released,
-- cancel_requested, cancelled, redriven), newest last, bounded.
SELECT seq, kind, data, created_at
  FROM agent_run_events
 WHERE run_id = %(id)s AND kind LIKE 'run.%%'
 ORDER BY seq DESC
 LIMIT %(limit)s;
