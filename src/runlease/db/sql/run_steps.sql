-- Durable step results (agent_run_steps).


-- name: run_step_record
-- Commit a step's result, fenced by the lease. FOR SHARE makes the fence a
-- lock: a reap or re-claim that commits first is seen (the locking read
-- re-checks the newest row version), one that comes later waits for us.
WITH fence AS (
    SELECT r.id, r.lease_epoch, r.attempts
      FROM agent_runs r
     WHERE r.id = %(id)s
       AND r.lease_epoch = %(epoch)s
       AND r.locked_by = %(worker)s
       AND (r.status = 'leased') IS TRUE
       AND r.locked_until > coalesce(%(now)s::timestamptz, now())
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
