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
       (id, pool, version, concurrency, runs_held, started_at, heartbeat_at, expires_at)
SELECT %(worker)s, %(pool)s, %(version)s, %(concurrency)s, 0, clock.ts, clock.ts,
       clock.ts + make_interval(secs => coalesce(
           %(lease_s)s::integer,
           (SELECT p.lease_s FROM agent_run_pools p WHERE p.name = %(pool)s::text), 45))
  FROM clock
    ON CONFLICT (id) DO UPDATE
   SET runs_held = 0, heartbeat_at = excluded.heartbeat_at,
       expires_at = excluded.expires_at;


-- name: worker_deregister
-- A clean shutdown: the worker's runs are already released.
DELETE FROM agent_run_workers WHERE id = %(worker)s;


-- name: worker_delete_stale
-- The reaper's leader: rows whose worker has not renewed them for a while.
-- Runs such a worker may still hold are reaped all the same (a holder
-- without a row is looked at like one whose row expired).
DELETE FROM agent_run_workers
 WHERE expires_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(after_s)s)
RETURNING id, pool;


-- name: worker_list
SELECT w.*, w.expires_at > coalesce(%(now)s::timestamptz, now()) AS alive
  FROM agent_run_workers w
 WHERE (%(pool)s::text IS NULL OR w.pool = %(pool)s::text)
 ORDER BY w.pool, w.started_at, w.id
 LIMIT %(limit)s;
