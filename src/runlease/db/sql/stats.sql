-- Read-only statistics for the operator and metrics.


-- name: pool_queue_stats
-- A pool's queue by tenant: pending (all, and available now), leased, and
-- the oldest available pending run's wait. Reads the partial indexes only.
SELECT r.tenant_id,
       count(*) FILTER (WHERE r.status = 'pending') AS pending,
       count(*) FILTER (WHERE r.status = 'pending'
                          AND r.available_at <= coalesce(%(now)s::timestamptz, now())) AS ready,
       count(*) FILTER (WHERE r.status = 'leased') AS leased,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now())
               - min(r.available_at) FILTER (
                     WHERE r.status = 'pending'
                       AND r.available_at <= coalesce(%(now)s::timestamptz, now())))
           AS oldest_ready_s
  FROM agent_runs r
 WHERE r.pool = %(pool)s AND r.status IN ('pending', 'leased')
 GROUP BY r.tenant_id;


-- name: pool_dead_stats
SELECT error_code, count(*) AS n
  FROM agent_runs
 WHERE pool = %(pool)s AND status = 'dead'
 GROUP BY error_code;


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
-- not being cancelled, and within its tenant's cap (the tenant's override,
-- else the pool's default; what the tenant already holds leased is taken
-- off). A tenant capped at 2 with 1,000 pending counts 2. A paused pool, or
-- one without a row, has none. The autoscaler sizes the pool by this.
SELECT coalesce(sum(CASE WHEN coalesce(t.max_in_flight, p.default_max_in_flight) IS NULL
                         THEN q.ready
                         ELSE least(q.ready, greatest(coalesce(t.max_in_flight,
                                                               p.default_max_in_flight)
                                                      - q.leased, 0))
                    END), 0)::bigint AS n
  FROM (SELECT r.tenant_id,
               count(*) FILTER (WHERE r.status = 'pending'
                                  AND r.available_at <= coalesce(%(now)s::timestamptz, now())
                                  AND r.cancel_requested_at IS NULL) AS ready,
               count(*) FILTER (WHERE r.status = 'leased') AS leased
          FROM agent_runs r
         WHERE r.pool = %(pool)s AND r.status IN ('pending', 'leased')
         GROUP BY r.tenant_id) q
  JOIN agent_run_pools p ON p.name = %(pool)s AND NOT p.paused
  LEFT JOIN agent_run_tenant_limits t ON t.pool = p.name AND t.tenant_id = q.tenant_id;
