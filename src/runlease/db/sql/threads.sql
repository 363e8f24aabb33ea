-- Threads (issue 27, migration 0017): a tenant's conversation; at most one
-- run of a thread is active, the others wait in submit order. A thread's
-- head is the one run of it that may be claimed or is active; a submit to a
-- thread with a head parks the new run (out of every claim path) until
-- runlease_thread_advance (functions.sql) makes it the head.


-- name: thread_lock
-- The thread's row, created on its first submit, locked for the submit's
-- transaction (a thread's submits and its head's finish serialize on it),
-- and its head. (The head's own row is read by a later statement: this
-- one's snapshot predates the lock it may have waited for.)
WITH {{clock}}
INSERT INTO agent_run_threads AS t (tenant_id, thread_id, created_at, updated_at)
SELECT %(tenant)s, %(thread)s, clock.ts, clock.ts FROM clock
    ON CONFLICT (tenant_id, thread_id) DO UPDATE SET updated_at = excluded.updated_at
RETURNING t.head_run_id;


-- name: thread_join
-- A run just inserted (same transaction, thread row locked by thread_lock)
-- joins its thread: it takes the next thread_seq, and becomes the head if
-- the thread has none, or is parked (delayed, available_at far ahead, its
-- due time kept in thread_due_at) behind it.
WITH {{clock}}, t AS (
    UPDATE agent_run_threads t
       SET next_seq = t.next_seq + 1, updated_at = clock.ts,
           head_run_id = coalesce(t.head_run_id, %(id)s::uuid)
      FROM clock
     WHERE t.tenant_id = %(tenant)s AND t.thread_id = %(thread)s
    RETURNING t.next_seq - 1 AS seq, t.head_run_id
)
UPDATE agent_runs r
   SET thread_id = %(thread)s, thread_seq = t.seq,
       delayed = r.delayed OR t.head_run_id <> r.id,
       thread_due_at = CASE WHEN t.head_run_id <> r.id THEN r.available_at END,
       available_at = CASE WHEN t.head_run_id <> r.id
                           THEN '9999-01-01 00:00:00+00'::timestamptz
                           ELSE r.available_at END
  FROM t
 WHERE r.id = %(id)s AND r.tenant_id = %(tenant)s AND r.status = 'pending'
   AND r.thread_id IS NULL
RETURNING r.*;


-- name: thread_flag_rolled_back
-- An interrupted run (multitask 'rollback') is flagged, while unfinished: a
-- run that finished before the interrupt landed was not interrupted.
UPDATE agent_runs
   SET rolled_back = true
 WHERE id = %(id)s AND tenant_id = %(tenant)s AND finished_at IS NULL
RETURNING id;


-- name: thread_get
-- A tenant's thread: its head (the active or next run), how many runs it
-- had, and its latest answer (the newest done run not rolled back).
SELECT t.tenant_id, t.thread_id, t.head_run_id, h.status AS head_status,
       t.next_seq - 1 AS runs, t.created_at, t.updated_at,
       (SELECT r.id FROM agent_runs r
         WHERE r.tenant_id = t.tenant_id AND r.thread_id = t.thread_id
           AND r.status = 'done' AND NOT r.rolled_back
         ORDER BY r.thread_seq DESC LIMIT 1) AS latest_run_id
  FROM agent_run_threads t
  LEFT JOIN agent_runs h ON h.id = t.head_run_id
 WHERE t.tenant_id = %(tenant)s AND t.thread_id = %(thread)s;


-- name: thread_runs
-- A thread's runs in submit order, keyset pages after a thread_seq.
SELECT r.* FROM agent_runs r
 WHERE r.tenant_id = %(tenant)s AND r.thread_id = %(thread)s
   AND r.thread_id IS NOT NULL
   AND r.thread_seq > %(after)s
 ORDER BY r.thread_seq
 LIMIT %(limit)s;
