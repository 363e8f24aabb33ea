-- Tenant rates: the submit rate (checked by the API before an enqueue; the
-- token rate is checked inside runlease_claim, functions.sql).


-- name: tenant_submit_lock
-- The tenant's submit rate in the pool, and, when it has one, its submit
-- lock for the rest of the transaction: submits of one rated tenant are
-- counted and inserted one transaction at a time, so the rate is exact.
SELECT t.submits_per_minute,
       pg_advisory_xact_lock(1381322317, hashtext(%(pool)s || '/' || %(tenant)s)) IS NULL
           AS locked
  FROM agent_run_tenant_limits t
 WHERE t.pool = %(pool)s AND t.tenant_id = %(tenant)s AND t.submits_per_minute IS NOT NULL;


-- name: tenant_submits_recent
-- A new statement after the lock, so a new snapshot: the tenant's runs of the
-- pool submitted in the last minute (through the tenant's index, from an id
-- floor: run ids are time-ordered), and when enough of them leave the minute
-- for `n` more to fit under the rate.
WITH {{clock}}, w AS (
    SELECT r.created_at
      FROM agent_run_tenant_index t
      JOIN agent_runs r ON r.id = t.run_id, clock
     WHERE t.tenant_id = %(tenant)s
       AND t.run_id >= %(floor)s::uuid
       AND r.pool = %(pool)s
       AND r.created_at > clock.ts - interval '60 seconds'
), c AS (
    SELECT count(*) AS n FROM w
)
SELECT c.n AS recent,
       (SELECT extract(epoch FROM w.created_at + interval '60 seconds' - clock.ts)
          FROM w
         ORDER BY w.created_at
        OFFSET greatest(c.n + %(n)s - %(limit)s - 1, 0)
         LIMIT 1)::float8 AS wait_s
  FROM c, clock;
