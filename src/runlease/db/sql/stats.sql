-- Read-only statistics for the operator and metrics.


-- name: pool_queue_stats
-- A pool's queue by tenant: pending (all, and available now), leased,
-- waiting for input, and the oldest available pending run's wait. Pending and delayed come from the
-- maintained counts (agent_run_counts plus the deltas not folded yet: one
-- snapshot, so a fold in between is seen whole or not at all); leased from
-- agent_runs_leased_idx (bounded by what is in flight); runs in backoff whose
-- time has come but that no claim has promoted yet from agent_runs_delayed_idx;
-- the oldest wait from the head of agent_runs_ready_idx.
WITH {{clock}}, counted AS (
    SELECT c.tenant_id, c.state, c.n FROM agent_run_counts c
     WHERE c.pool = %(pool)s AND c.state IN ('pending', 'delayed', 'waiting')
    UNION ALL
    SELECT d.tenant_id, d.state, d.n FROM agent_run_count_deltas d
     WHERE d.pool = %(pool)s AND d.state IN ('pending', 'delayed', 'waiting')
), waiting AS (
    SELECT c.tenant_id,
           coalesce(sum(c.n) FILTER (WHERE c.state <> 'waiting'), 0) AS pending,
           coalesce(sum(c.n) FILTER (WHERE c.state = 'pending'), 0) AS ready,
           -- Runs waiting for a person (issue 28): not claimable, not pending.
           coalesce(sum(c.n) FILTER (WHERE c.state = 'waiting'), 0) AS for_input
      FROM counted c
     GROUP BY c.tenant_id
), due AS (
    SELECT r.tenant_id, count(*) AS n, min(r.available_at) AS oldest
      FROM agent_runs r, clock
     WHERE r.pool = %(pool)s AND r.status = 'pending' AND r.delayed
       AND r.available_at <= clock.ts
     GROUP BY r.tenant_id
), {{pool_leased}}, oldest AS (
    SELECT least((SELECT r.available_at FROM agent_runs r
                   WHERE r.pool = %(pool)s AND r.status = 'pending' AND NOT r.delayed
                     -- Names agent_runs_ready_idx (migration 0015 says why).
                     AND r.available_at > '-infinity'
                   ORDER BY r.available_at LIMIT 1),
                 (SELECT min(due.oldest) FROM due)) AS at
)
SELECT t.tenant_id,
       coalesce(w.pending, 0) AS pending,
       coalesce(w.ready, 0) + coalesce(due.n, 0) AS ready,
       coalesce(l.n, 0) AS leased,
       coalesce(w.for_input, 0) AS waiting,
       -- The pool's oldest wait, on every row (the caller takes the largest).
       CASE WHEN coalesce(w.ready, 0) + coalesce(due.n, 0) > 0
            THEN extract(epoch FROM clock.ts - oldest.at) END AS oldest_ready_s
  FROM (SELECT w.tenant_id FROM waiting w WHERE w.pending <> 0 OR w.for_input <> 0
        UNION SELECT l.tenant_id FROM leased l) t
  LEFT JOIN waiting w USING (tenant_id)
  LEFT JOIN leased l USING (tenant_id)
  LEFT JOIN due USING (tenant_id)
 CROSS JOIN clock
 CROSS JOIN oldest;


-- name: pool_dead_stats
-- Dead runs by error code, from the maintained counts.
SELECT nullif(c.error_code, '') AS error_code, sum(c.n) AS n
  FROM (SELECT k.error_code, k.n FROM agent_run_counts k
         WHERE k.pool = %(pool)s AND k.state = 'dead'
        UNION ALL
        SELECT d.error_code, d.n FROM agent_run_count_deltas d
         WHERE d.pool = %(pool)s AND d.state = 'dead') c
 GROUP BY c.error_code
HAVING sum(c.n) <> 0;


-- name: counts_fold
-- The reaper's leader, every pass: move the deltas into the totals, in one
-- statement (a reader sees them in one place or the other, never both).
-- Deltas of transactions not committed yet are not seen, and wait for the
-- next fold. Two folds at once each move the rows they deleted.
WITH moved AS (
    DELETE FROM agent_run_count_deltas
    RETURNING pool, tenant_id, state, error_code, n
), sums AS (
    SELECT m.pool, m.tenant_id, m.state, m.error_code, sum(m.n) AS n
      FROM moved m
     GROUP BY 1, 2, 3, 4
), folded AS (
    INSERT INTO agent_run_counts AS c (pool, tenant_id, state, error_code, n)
    SELECT s.pool, s.tenant_id, s.state, s.error_code, s.n FROM sums s WHERE s.n <> 0
        ON CONFLICT (pool, tenant_id, state, error_code) DO UPDATE SET n = c.n + excluded.n
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved) AS deltas, (SELECT count(*) FROM folded) AS totals;


-- name: counts_prune
-- Totals that came back to zero (a tenant whose runs all finished).
DELETE FROM agent_run_counts WHERE n = 0;


-- name: counts_touch
-- Read the deltas' pages once after a fold, so pruning the rows it deleted
-- is paid here by the leader, not by the next reader of the counts.
SELECT count(*) AS n FROM agent_run_count_deltas;


-- name: counts_vacuum
-- After a large fold: give the emptied pages back, so readers do not scan
-- them until autovacuum comes (a small table: milliseconds).
VACUUM (SKIP_LOCKED) agent_run_count_deltas;


-- name: pool_leases_by_holder
-- Leased runs per holder, by the first part of locked_by (the pod UID).
SELECT split_part(locked_by, ':', 1) AS holder, count(*) AS n
  FROM agent_runs
 WHERE pool = %(pool)s AND status = 'leased'
 GROUP BY 1;


-- name: pool_lease_expiries
SELECT count(*) AS n
  FROM agent_run_events e
  JOIN agent_runs r ON r.id = e.run_id
 WHERE e.kind = 'run.lease_expired'
   AND e.created_at > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window_s)s)
   AND r.pool = %(pool)s;


-- name: pool_startable
-- The pool's pending runs a claim could take now, as the claim function
-- decides: due (a run in backoff counts once its available_at has passed),
-- not being cancelled (a pending run never is), and within its tenant's cap
-- (the tenant's override, else the pool's default; what the tenant already
-- holds leased is taken off). A tenant capped at 2 with 1,000 pending counts
-- 2. A paused pool, or one without a row, has none. The autoscaler sizes
-- the pool by this. Ready runs come from the maintained counts (see
-- pool_queue_stats), leased ones from agent_runs_leased_idx.
WITH {{clock}}, ready AS (
    SELECT c.tenant_id, sum(c.n) AS n
      FROM (SELECT k.tenant_id, k.n FROM agent_run_counts k
             WHERE k.pool = %(pool)s AND k.state = 'pending'
            UNION ALL
            SELECT d.tenant_id, d.n FROM agent_run_count_deltas d
             WHERE d.pool = %(pool)s AND d.state = 'pending'
            UNION ALL
            SELECT r.tenant_id, 1 FROM agent_runs r, clock
             WHERE r.pool = %(pool)s AND r.status = 'pending' AND r.delayed
               AND r.available_at <= clock.ts) c
     GROUP BY c.tenant_id
), {{pool_leased}}
SELECT coalesce(sum(CASE WHEN coalesce(t.max_in_flight, p.default_max_in_flight) IS NULL
                         THEN q.n
                         ELSE least(q.n, greatest(coalesce(t.max_in_flight,
                                                           p.default_max_in_flight)
                                                  - coalesce(l.n, 0), 0))
                    END), 0)::bigint AS n
  FROM ready q
  LEFT JOIN leased l USING (tenant_id)
  JOIN agent_run_pools p ON p.name = %(pool)s AND NOT p.paused
  LEFT JOIN agent_run_tenant_limits t ON t.pool = p.name AND t.tenant_id = q.tenant_id;
