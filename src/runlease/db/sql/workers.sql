-- The workers registry (agent_run_workers): one row per worker incarnation,
-- which is also the lease of every run it holds (locked_by = its id): a run's
-- lease lives while its holder's row is live, not ended and unexpired by the
-- database clock. The heartbeat renews that one row (worker_heartbeat),
-- whatever the runs held; the reaper ends rows that expired and requeues
-- their runs (run_reap); an ended row never renews again, and its worker
-- registers under a new id.


-- name: worker_register
-- A new incarnation (a worker at start, or again after its last one ended).
-- Ids are never reused: an id taken already returns no row.
WITH {{clock}}
INSERT INTO agent_run_workers AS w
       (id, pool, version, concurrency, runs_held, started_at, heartbeat_at, expires_at)
SELECT %(worker)s, %(pool)s, %(version)s, %(concurrency)s, 0, clock.ts, clock.ts,
       clock.ts + make_interval(secs => %(lease_s)s)
  FROM clock
    ON CONFLICT (id) DO NOTHING
RETURNING w.*, true AS alive;


-- name: worker_heartbeat
-- Renew one incarnation, and with it the lease of every run it holds: one
-- row, however many runs. Only a live row renews (not ended, unexpired by
-- the database clock): no row back means the incarnation is over, and its
-- worker must stop every run it holds and register again. Also adds the
-- stale writes the worker saw since its last beat, and tells it of the
-- cancels of its runs (a NOTIFY is not durable; agent_runs_cancel_held_idx:
-- a few rows, whatever the runs held). Only heartbeat_at, expires_at,
-- runs_held and stale_writes change, none indexed: a HOT update.
WITH {{clock}}, upd AS (
    UPDATE agent_run_workers w
       SET heartbeat_at = clock.ts,
           expires_at = clock.ts + make_interval(secs => %(lease_s)s),
           runs_held = %(runs_held)s,
           stale_writes = w.stale_writes + %(stale_writes)s::bigint
      FROM clock
     WHERE w.id = %(worker)s AND w.ended_at IS NULL AND w.expires_at > clock.ts
    RETURNING w.expires_at
)
SELECT upd.expires_at,
       -- No status here: only agent_runs_cancel_held_idx can serve it (see
       -- migration 0015); locked_by is set exactly while leased.
       ARRAY(SELECT r.id FROM agent_runs r
              WHERE r.locked_by = %(worker)s
                AND r.cancel_requested_at IS NOT NULL) AS cancel_requested
  FROM upd;


-- name: worker_deregister
-- A clean shutdown: the incarnation ends. Runs it still holds (none, after a
-- drain that finished) are requeued by the reaper's next pass.
WITH {{clock}}
UPDATE agent_run_workers w
   SET ended_at = clock.ts
  FROM clock
 WHERE w.id = %(worker)s AND w.ended_at IS NULL;


-- name: worker_delete_stale
-- The reaper's leader: rows of incarnations over for a while (ended, or
-- expired and never renewed since). Runs such a holder may still hold are
-- reaped all the same (a holder without a row cannot renew). Their stale
-- writes not folded yet are folded now (pool_health_fold_stale).
WITH gone AS (
    DELETE FROM agent_run_workers
     WHERE least(ended_at, expires_at) < coalesce(%(now)s::timestamptz, now())
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
SELECT w.*, w.ended_at IS NULL AND w.expires_at > coalesce(%(now)s::timestamptz, now()) AS alive
  FROM agent_run_workers w
 WHERE (%(pool)s::text IS NULL OR w.pool = %(pool)s::text)
 ORDER BY w.pool, w.started_at, w.id
 LIMIT %(limit)s;


-- name: pool_service
-- Per pool (one, or every one): whether one of its runs could be claimed
-- now (pending and due, the pool not paused) and how many live workers
-- serve it (registered, not ended, unexpired by the database clock). A pool
-- with claimable runs and no live worker is flagged (the console's pools
-- page, GET /v1/pools, `runlease pools list`: issue 29). Two probes of the
-- pool's ready and delayed indexes, never a count of its runs; the workers
-- of a pool are a few rows.
WITH {{clock}}
SELECT p.name AS pool,
       (SELECT count(*) FROM agent_run_workers w
         WHERE w.pool = p.name AND w.ended_at IS NULL AND w.expires_at > clock.ts
       ) AS live_workers,
       NOT p.paused AND (
           EXISTS (SELECT 1 FROM agent_runs r
                    WHERE r.pool = p.name AND r.status = 'pending' AND NOT r.delayed
                      AND r.available_at > '-infinity' AND r.available_at <= clock.ts)
           OR EXISTS (SELECT 1 FROM agent_runs r
                       WHERE r.pool = p.name AND r.status = 'pending' AND r.delayed
                         AND r.available_at <= clock.ts)) AS claimable
  FROM agent_run_pools p CROSS JOIN clock
 WHERE %(pool)s::text IS NULL OR p.name = %(pool)s::text
 ORDER BY p.name;
