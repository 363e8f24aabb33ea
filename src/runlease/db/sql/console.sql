-- Reads for the web console (api/console/): bounded, tenant-scoped.


-- name: console_status_counts
-- Runs per status among the newest %(window)s runs (admin: every tenant's,
-- newest first by the primary key), then narrowed to a pool: a bounded read
-- however large the table grows, polled by the runs page.
SELECT w.status, count(*) AS n, sum(count(*)) OVER () AS seen
  FROM (SELECT r.status, r.pool FROM agent_runs r
         ORDER BY r.id DESC
         LIMIT %(window)s) w
 WHERE %(pool)s::text IS NULL OR w.pool = %(pool)s::text
 GROUP BY w.status;


-- name: console_status_counts_tenant
-- The same for one tenant, from its side-table index (newest first).
SELECT w.status, count(*) AS n, sum(count(*)) OVER () AS seen
  FROM (SELECT r.status, r.pool
          FROM agent_run_tenant_index d
          JOIN agent_runs r ON r.id = d.run_id
         WHERE d.tenant_id = %(tenant)s
         ORDER BY d.run_id DESC
         LIMIT %(window)s) w
 WHERE %(pool)s::text IS NULL OR w.pool = %(pool)s::text
 GROUP BY w.status;


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
