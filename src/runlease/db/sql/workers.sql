-- The workers registry (agent_run_workers): who is running, for the console
-- and for the reaper, which looks for expired leases only among the runs of
-- workers whose row expired. A running worker's row is renewed by its lease
-- keeper inside run_heartbeat (or worker_beat when it holds nothing).


-- name: worker_register
-- At start (and again if the row was deleted while the worker was away).
WITH {{clock}}
INSERT INTO agent_run_workers AS w
       (id, pool, version, concurrency, runs_held, started_at, heartbeat_at, expires_at)
SELECT %(worker)s, %(pool)s, %(version)s, %(concurrency)s, 0, clock.ts, clock.ts,
       clock.ts + make_interval(secs => %(lease_s)s)
  FROM clock
    ON CONFLICT (id) DO UPDATE
   SET pool = excluded.pool, version = excluded.version,
       concurrency = excluded.concurrency, runs_held = 0,
       started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
       expires_at = excluded.expires_at
RETURNING w.*, w.expires_at > (SELECT ts FROM clock) AS alive;


-- name: worker_beat
-- A heartbeat of a worker that holds no run (run_heartbeat renews the row
-- of one that does). Inserts the row if it is gone.
WITH {{clock}}
INSERT INTO agent_run_workers AS w
       (id, pool, version, concurrency, runs_held, started_at, heartbeat_at, expires_at,
        stale_writes)
SELECT %(worker)s, %(pool)s, %(version)s, %(concurrency)s, 0, clock.ts, clock.ts,
       clock.ts + make_interval(secs => coalesce(
           %(lease_s)s::integer,
           (SELECT p.lease_s FROM agent_run_pools p WHERE p.name = %(pool)s::text), 45)),
       %(stale_writes)s::bigint
  FROM clock
    ON CONFLICT (id) DO UPDATE
   SET runs_held = 0, heartbeat_at = excluded.heartbeat_at,
       expires_at = excluded.expires_at,
       stale_writes = w.stale_writes + excluded.stale_writes;


-- name: worker_deregister
-- A clean shutdown: the worker's runs are already released.
DELETE FROM agent_run_workers WHERE id = %(worker)s;


-- name: worker_delete_stale
-- The reaper's leader: rows whose worker has not renewed them for a while.
-- Runs such a worker may still hold are reaped all the same (a holder
-- without a row is looked at like one whose row expired). Their stale
-- writes not folded yet are folded now (pool_health_fold_stale).
WITH gone AS (
    DELETE FROM agent_run_workers
     WHERE expires_at < coalesce(%(now)s::timestamptz, now())
                        - make_interval(secs => %(after_s)s)
    RETURNING id, pool, stale_writes
), health AS (
    INSERT INTO agent_run_pool_health AS h (pool, minute, stale_writes)
    SELECT g.pool, date_trunc('minute', coalesce(%(now)s::timestamptz, now())),
           sum(g.stale_writes)
      FROM gone g
     WHERE g.stale_writes > 0
     GROUP BY 1, 2
     ORDER BY 1  -- one lock order, should two leaders overlap
        ON CONFLICT (pool, minute)
        DO UPDATE SET stale_writes = h.stale_writes + excluded.stale_writes
)
SELECT id, pool FROM gone;


-- name: pool_health_fold_stale
-- The reaper's leader, every pass: the stale writes the workers' heartbeats
-- added to their registry rows move into this minute's row of their pool.
-- The locking read takes each row's latest count (a heartbeat adding to it
-- meanwhile waits, then adds to the zero).
WITH seen AS (
    SELECT w.id, w.pool, w.stale_writes
      FROM agent_run_workers w
     WHERE w.stale_writes > 0
       FOR UPDATE
), reset AS (
    UPDATE agent_run_workers w SET stale_writes = 0
      FROM seen WHERE w.id = seen.id
), health AS (
    INSERT INTO agent_run_pool_health AS h (pool, minute, stale_writes)
    SELECT seen.pool, date_trunc('minute', coalesce(%(now)s::timestamptz, now())),
           sum(seen.stale_writes)
      FROM seen
     GROUP BY 1, 2
     ORDER BY 1  -- one lock order, should two leaders overlap
        ON CONFLICT (pool, minute)
        DO UPDATE SET stale_writes = h.stale_writes + excluded.stale_writes
)
SELECT coalesce(sum(seen.stale_writes), 0)::bigint AS n FROM seen;


-- name: pool_health_prune
-- Minutes older than the console shows (a day kept, for a look back).
DELETE FROM agent_run_pool_health
 WHERE minute < coalesce(%(now)s::timestamptz, now()) - interval '1 day';


-- name: pool_health_recent
-- Each pool's lease expiries and stale writes over the last %(window_s)s
-- seconds, by whole minutes (the cutoff's minute included).
SELECT h.pool, sum(h.lease_expiries)::bigint AS lease_expiries,
       sum(h.stale_writes)::bigint AS stale_writes
  FROM agent_run_pool_health h
 WHERE h.minute >= date_trunc('minute', coalesce(%(now)s::timestamptz, now())
                                        - make_interval(secs => %(window_s)s))
   AND (%(pool)s::text IS NULL OR h.pool = %(pool)s::text)
 GROUP BY h.pool;


-- name: worker_list
SELECT w.*, w.expires_at > coalesce(%(now)s::timestamptz, now()) AS alive
  FROM agent_run_workers w
 WHERE (%(pool)s::text IS NULL OR w.pool = %(pool)s::text)
 ORDER BY w.pool, w.started_at, w.id
 LIMIT %(limit)s;
