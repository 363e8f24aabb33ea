-- Child runs: submitted by a run (same tenant), listed by parent, waited for
-- by the parent without holding a worker slot, cancelled with the parent.


-- name: run_fence_share
-- The parent's lease, checked and share-locked for the transaction that
-- submits its child: a reap or re-claim committed first is seen, one that
-- comes later waits for us. No row: the lease is gone.
SELECT r.id, r.pool, r.tenant_id,
       (SELECT count(*) FROM agent_runs c WHERE c.parent_run_id = r.id) AS children
  FROM agent_runs r
 WHERE {{lease_held}}
   FOR SHARE;


-- name: run_parent_get
-- A would-be parent named at submit, share-locked so it cannot be cancelled
-- between the check and the child's insert (the cancel would miss the child).
SELECT id, tenant_id, pool, status, cancel_requested_at,
       (SELECT count(*) FROM agent_runs c WHERE c.parent_run_id = %(id)s) AS children
  FROM agent_runs
 WHERE id = %(id)s
   FOR SHARE;


-- name: run_parent_set
-- The child's parent, set in the transaction that inserted it.
UPDATE agent_runs
   SET parent_run_id = %(parent)s
 WHERE id = %(id)s AND parent_run_id IS NULL;


-- name: run_children_summary
-- What wait_children hands the parent: each child's outcome.
SELECT id, status, result_json, error_code
  FROM agent_runs
 WHERE parent_run_id = %(id)s
 ORDER BY id
 LIMIT %(limit)s;


-- name: run_children_list
-- A run's children, newest first, keyset pages; a tenant sees its own only.
SELECT * FROM agent_runs
 WHERE parent_run_id = %(parent)s
   AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s::text)
   AND (%(status)s::text IS NULL OR status = %(status)s::text)
   AND (%(pool)s::text IS NULL OR pool = %(pool)s::text)
   AND (%(before)s::uuid IS NULL OR id < %(before)s::uuid)
 ORDER BY id DESC
 LIMIT %(limit)s;


-- name: run_wait_children
-- wait (children): leased & mine -> pending without charging the attempt
-- (as a release), delayed and awaiting_children with available_at far ahead
-- while any child is unfinished, so it holds no worker slot and the claim's
-- promotion never reads it; due at once if none is (a child finished
-- meanwhile); cancelled if its cancel was requested.
WITH {{clock}}, open AS (
    SELECT EXISTS (SELECT 1 FROM agent_runs c
                    WHERE c.parent_run_id = %(id)s
                      AND c.status IN ('pending', 'leased', 'waiting')) AS waiting
), upd AS (
    UPDATE agent_runs r
       SET status = CASE WHEN r.cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
           attempts = CASE WHEN r.cancel_requested_at IS NULL THEN r.attempts - 1
                           ELSE r.attempts END,
           finished_at = CASE WHEN r.cancel_requested_at IS NOT NULL THEN clock.ts END,
           delayed = r.cancel_requested_at IS NULL,
           awaiting_children = r.cancel_requested_at IS NULL AND open.waiting,
           available_at = CASE WHEN r.cancel_requested_at IS NULL AND open.waiting
                               THEN '9999-01-01 00:00:00+00'::timestamptz
                               ELSE clock.ts END,
           locked_by = NULL,
           event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock, open
     WHERE {{lease_held}}
    RETURNING r.id, r.pool, r.status, r.event_seq, r.awaiting_children
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq,
           CASE upd.status WHEN 'cancelled' THEN 'run.cancelled' ELSE 'run.waiting' END, '{}'::jsonb,
           clock.ts
      FROM upd, clock
), notify AS (
    SELECT runlease_notify_pending(%(channel_prefix)s,
                                   array(SELECT upd.pool FROM upd WHERE upd.status = 'pending')) AS n
), {{events_notify}}
SELECT upd.id, upd.status, upd.awaiting_children FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_children_wake
-- Parents whose children have all finished become due (the next claim
-- promotes them), a bounded batch; run by the reaper's leader.
WITH {{clock}}, due AS (
    SELECT w.id FROM agent_runs w
     WHERE w.awaiting_children AND w.status = 'pending'
       AND NOT EXISTS (SELECT 1 FROM agent_runs c
                        WHERE c.parent_run_id = w.id
                          AND c.status IN ('pending', 'leased', 'waiting'))
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE agent_runs r
       SET awaiting_children = false, available_at = clock.ts,
           event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM due, clock
     WHERE r.id = due.id
    RETURNING r.id, r.pool, r.event_seq
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq, 'run.children_finished', '{}'::jsonb, clock.ts
      FROM upd, clock
), notify AS (
    SELECT runlease_notify_pending(%(channel_prefix)s, array(SELECT upd.pool FROM upd)) AS n
), {{events_notify}}
SELECT upd.id FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_descendants_open
-- A run's unfinished descendants (children, their children...), for the
-- cancel cascade; bounded.
WITH RECURSIVE tree AS (
    SELECT c.id, c.status, 1 AS depth FROM agent_runs c WHERE c.parent_run_id = %(id)s
    UNION ALL
    SELECT c.id, c.status, t.depth + 1
      FROM agent_runs c JOIN tree t ON c.parent_run_id = t.id
     WHERE t.depth < 32
)
SELECT id FROM tree WHERE status IN ('pending', 'leased', 'waiting') LIMIT %(limit)s;
