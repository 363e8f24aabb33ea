-- Singletons and debounce (issue 27, migration 0017): a key's row, locked
-- for the submit's transaction, names the run a submit may answer with.


-- name: singleton_lock
-- The key's row (made on first use), locked, and its run. The run's state
-- is read by the next statement (singleton_open): this one's snapshot
-- predates the lock it may have waited for, so a run that a submit holding
-- the lock committed would not be seen here.
WITH {{clock}}
INSERT INTO agent_run_singletons AS s (pool, tenant_id, key, updated_at)
SELECT %(pool)s, %(tenant)s, %(key)s, clock.ts FROM clock
    ON CONFLICT (pool, tenant_id, key) DO UPDATE SET updated_at = excluded.updated_at
RETURNING s.run_id;


-- name: singleton_open
-- Whether the key's run is unfinished (pending, leased).
SELECT EXISTS (SELECT 1 FROM agent_runs r
                WHERE r.id = %(id)s AND r.finished_at IS NULL) AS open;


-- name: singleton_set
UPDATE agent_run_singletons
   SET run_id = %(id)s
 WHERE pool = %(pool)s AND tenant_id = %(tenant)s AND key = %(key)s;


-- name: debounce_lock
-- The key's row (made on first use), locked, its run and first submit
-- (whether the run is still pending: debounce_replace, a later statement).
WITH {{clock}}
INSERT INTO agent_run_debounces AS d (pool, tenant_id, key, updated_at)
SELECT %(pool)s, %(tenant)s, %(key)s, clock.ts FROM clock
    ON CONFLICT (pool, tenant_id, key) DO UPDATE SET updated_at = excluded.updated_at
RETURNING d.run_id, d.first_at;


-- name: debounce_replace
-- A submit within the window: the pending run takes the new input and
-- starts later, window_s from now, never past first_at + max_delay_s. Back
-- out of the claim's indexes (delayed) until then; a claim that locked it
-- first wins (no row: the caller makes a new run).
WITH {{clock}}
UPDATE agent_runs r
   SET input_json = %(input)s::jsonb,
       delayed = true,
       available_at = greatest(least(clock.ts + make_interval(secs => %(window_s)s),
                                     %(first_at)s::timestamptz
                                     + make_interval(secs => %(max_delay_s)s)),
                               clock.ts),
       updated_at = clock.ts
  FROM clock
 WHERE r.id = %(id)s AND r.status = 'pending' AND r.cancel_requested_at IS NULL
RETURNING r.*;


-- name: debounce_set
WITH {{clock}}
UPDATE agent_run_debounces
   SET run_id = %(id)s, first_at = clock.ts
  FROM clock
 WHERE pool = %(pool)s AND tenant_id = %(tenant)s AND key = %(key)s;
