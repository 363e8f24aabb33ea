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


-- name: tenant_queue_room
-- The tenant's quota of waiting runs in the pool (its own, else the pool's
-- default; NULL: none) and how many it has waiting now: the maintained
-- counts (one key lookup) and the deltas not yet folded into them (what
-- changed since the leader's last pass: bounded by the pass, not by the queue).
WITH q AS (
    SELECT coalesce(t.max_pending, p.default_max_pending) AS quota
      FROM agent_run_pools p
      LEFT JOIN agent_run_tenant_limits t
             ON t.pool = p.name AND t.tenant_id = %(tenant)s
     WHERE p.name = %(pool)s
)
SELECT q.quota,
       CASE WHEN q.quota IS NULL THEN 0 ELSE (
           SELECT coalesce(sum(w.n), 0)
             FROM (SELECT c.n FROM agent_run_counts c
                    WHERE c.pool = %(pool)s AND c.tenant_id = %(tenant)s
                      AND c.state IN ('pending', 'delayed')
                   UNION ALL
                   SELECT d.n FROM agent_run_count_deltas d
                    WHERE d.pool = %(pool)s AND d.tenant_id = %(tenant)s
                      AND d.state IN ('pending', 'delayed')) w
       ) END::bigint AS waiting
  FROM q;


-- name: run_key_taken
-- A run of the tenant's in the pool already has this idempotency key (a
-- repeated submit returns it, so no limit applies to it).
SELECT EXISTS (SELECT 1 FROM agent_runs r
                WHERE r.pool = %(pool)s AND r.tenant_id = %(tenant)s
                  AND r.idempotency_key = %(key)s) AS taken;
