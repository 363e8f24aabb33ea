-- Durable step results (agent_run_steps).


-- name: run_step_record
-- Commit a step's result, fenced by the lease. FOR SHARE makes the fence a
-- lock: a reap or re-claim that commits first is seen (the locking read
-- re-checks the newest row version), one that comes later waits for us.
WITH fence AS (
    SELECT r.id, r.lease_epoch, r.attempts
      FROM agent_runs r
     WHERE {{lease_held}}
       FOR SHARE
), ins AS (
    INSERT INTO agent_run_steps (run_id, step_key, result, lease_epoch, attempt, created_at)
    SELECT fence.id, %(key)s, %(result)s, fence.lease_epoch, fence.attempts,
           coalesce(%(now)s::timestamptz, now())
      FROM fence
        ON CONFLICT (run_id, step_key) DO NOTHING
    RETURNING result
)
-- No row when the fence failed (the lease is gone).
SELECT coalesce((SELECT result FROM ins),
                (SELECT s.result FROM agent_run_steps s
                  WHERE s.run_id = %(id)s AND s.step_key = %(key)s)) AS result
  FROM fence;


-- name: run_steps_get
SELECT run_id, step_key, result, lease_epoch, attempt, created_at
  FROM agent_run_steps
 WHERE run_id = %(id)s
 ORDER BY created_at, step_key;


-- name: run_steps_page
-- A page of a run's committed steps in step-key order (the primary key's, so
-- a page costs its own rows, however many steps the run has), after the
-- cursor. `fits`: within the page's byte budget, counted in stored (possibly
-- compressed) size; the step that crosses it is the last one that fits, so a
-- page always holds at least one step. Results are read for those only.
WITH page AS (
    SELECT s.step_key, s.lease_epoch, s.attempt, s.created_at,
           sum(pg_column_size(s.result)) OVER (ORDER BY s.step_key)
               - pg_column_size(s.result) AS before_bytes
      FROM agent_run_steps s
     WHERE s.run_id = %(id)s
       AND s.step_key > coalesce(%(after)s::text, '')
     ORDER BY s.step_key
     LIMIT %(limit)s
)
SELECT p.step_key, p.lease_epoch, p.attempt, p.created_at,
       p.before_bytes < %(max_bytes)s AS fits,
       CASE WHEN p.before_bytes < %(max_bytes)s THEN
           (SELECT s.result FROM agent_run_steps s
             WHERE s.run_id = %(id)s AND s.step_key = p.step_key)
       END AS result
  FROM page p
 ORDER BY p.step_key;
