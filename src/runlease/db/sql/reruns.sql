-- Reruns (issue 28): a new run of an old one's tenant, pool and thread, with
-- the steps the old one committed before a chosen step copied as committed,
-- so its agent replays them instead of running them again.


-- name: run_rerun_link
-- The new run (inserted in this transaction) names the old one, and starts
-- at lease_epoch 1 when steps were copied: an attempt loads its run's steps
-- unless its lease is the run's first (epoch 1), and this one has some.
UPDATE agent_runs
   SET rerun_of = %(old)s,
       lease_epoch = CASE WHEN %(copied)s::int > 0 THEN 1 ELSE lease_epoch END
 WHERE id = %(id)s AND status = 'pending' AND lease_epoch = 0;


-- name: run_rerun_copy_steps
-- The old run's steps committed before %(from_step)s (its commit time and
-- key order; all of them when that step was never committed, or none is
-- named), copied into the new run as committed by no attempt (0, 0).
WITH cut AS (
    SELECT s.created_at, s.step_key FROM agent_run_steps s
     WHERE s.run_id = %(old)s AND s.step_key = %(from_step)s
), copied AS (
    INSERT INTO agent_run_steps (run_id, step_key, result, lease_epoch, attempt, created_at)
    SELECT %(id)s, s.step_key, s.result, 0, 0, s.created_at
      FROM agent_run_steps s
     WHERE s.run_id = %(old)s
       AND %(from_step)s::text IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM cut
                        WHERE (s.created_at, s.step_key) >= (cut.created_at, cut.step_key))
    RETURNING step_key
)
SELECT count(*) AS copied FROM copied;


-- name: run_reruns_of
-- The reruns of a run, newest first.
SELECT id FROM agent_runs WHERE rerun_of = %(id)s ORDER BY created_at DESC LIMIT %(limit)s;
