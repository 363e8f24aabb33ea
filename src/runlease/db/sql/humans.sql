-- Humans in the loop and messages into a running run (issue 28, migration
-- 0018): a run waits for a person's input holding nothing, is resumed once
-- with the answer as the wait step's result, and takes the messages sent to
-- it exactly once per run, each as a durable step.
--
--   wait      leased & mine -> waiting: attempt not charged, no lease, no slot
--   answer    waiting & asked for <name> -> pending now, step 'input:<name>' = {"value": v}
--   timeout   waiting & the request's time is up -> pending, step = {"timed_out": true}
--   message   any unfinished run: appended to its inbox; its holder is woken


-- name: run_wait_input
-- wait (input): the attempt ends waiting for a person (as a release: the
-- attempt is not charged), the request stored (or kept, when an attempt
-- before asked the same), its input.requested and run.waiting events
-- written, and the pool's capped claimers told a slot is free. A run whose
-- cancel was requested ends cancelled instead.
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET status = CASE WHEN r.cancel_requested_at IS NULL THEN 'waiting' ELSE 'cancelled' END,
           attempts = CASE WHEN r.cancel_requested_at IS NULL THEN r.attempts - 1
                           ELSE r.attempts END,
           finished_at = CASE WHEN r.cancel_requested_at IS NOT NULL THEN clock.ts END,
           locked_by = NULL,
           event_seq = r.event_seq + CASE WHEN r.cancel_requested_at IS NULL THEN 2 ELSE 1 END,
           updated_at = clock.ts
      FROM clock
     WHERE {{lease_held}}
    RETURNING r.id, r.pool, r.status, r.event_seq
), req AS (
    INSERT INTO agent_run_inputs (run_id, name, prompt, schema, requested_at, timeout_at, nonce)
    SELECT upd.id, %(name)s, %(prompt)s, %(schema)s::jsonb, clock.ts,
           clock.ts + make_interval(secs => %(timeout_s)s::float8), %(nonce)s
      FROM upd, clock
     WHERE upd.status = 'waiting'
        ON CONFLICT (run_id, name) DO UPDATE
       SET prompt = EXCLUDED.prompt, schema = EXCLUDED.schema
     WHERE agent_run_inputs.answered_at IS NULL
    RETURNING timeout_at
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq - 1, 'input.requested',
           jsonb_build_object('name', %(name)s, 'prompt', %(prompt)s,
                              'schema', %(schema)s::jsonb,
                              'timeout_at', clock.ts + make_interval(secs => %(timeout_s)s::float8)),
           clock.ts
      FROM upd, clock WHERE upd.status = 'waiting'
    UNION ALL
    SELECT upd.id, upd.event_seq,
           CASE upd.status WHEN 'waiting' THEN 'run.waiting' ELSE 'run.cancelled' END,
           CASE upd.status WHEN 'waiting' THEN jsonb_build_object('input', %(name)s)
                ELSE '{}'::jsonb END,
           clock.ts
      FROM upd, clock
), notify AS (
    SELECT runlease_notify_freed(%(channel_prefix)s, array(SELECT upd.pool FROM upd)) AS n
), {{events_notify}}
SELECT upd.id, upd.status, (SELECT count(*) FROM req) AS asked
  FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_input_lock
-- The answer's first read, in its transaction: the run (a tenant's own
-- only), locked first (as a cancel and the timeouts lock it), so concurrent
-- answers, a cancel and a timeout are applied one after another. The
-- request is read by the next statement (run_input_get): under READ
-- COMMITTED a statement that waited for the lock re-reads the locked row
-- only, and would see a request answered meanwhile as still open.
SELECT r.id, r.pool, r.tenant_id, r.status
  FROM agent_runs r
 WHERE r.id = %(id)s
   AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)
   FOR UPDATE OF r;


-- name: run_input_get
-- The run's request for %(name)s, read after the run's lock (run_input_lock).
SELECT i.name, i.schema, i.nonce, i.timeout_at, i.answered_at, i.outcome, i.value,
       i.answered_by
  FROM agent_run_inputs i
 WHERE i.run_id = %(id)s AND i.name = %(name)s;


-- name: run_input_answer
-- answer: in the transaction that locked the run (run_input_lock) and found
-- it waiting for %(name)s: the request answered, the answer committed as the
-- wait step's result, the run pending and due now, its event written, its
-- pool's claimers woken.
WITH {{clock}}, ans AS (
    UPDATE agent_run_inputs i
       SET answered_at = clock.ts, outcome = 'answered', value = %(value)s::jsonb,
           answered_by = %(by)s
      FROM clock
     WHERE i.run_id = %(id)s AND i.name = %(name)s AND i.answered_at IS NULL
    RETURNING i.run_id
), upd AS (
    UPDATE agent_runs r
       SET status = 'pending', available_at = clock.ts,
           event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock, ans
     WHERE r.id = ans.run_id AND r.status = 'waiting'
    RETURNING r.id, r.pool, r.event_seq, r.lease_epoch, r.attempts
), step AS (
    INSERT INTO agent_run_steps (run_id, step_key, result, lease_epoch, attempt, created_at)
    SELECT upd.id, 'input:' || %(name)s, jsonb_build_object('value', %(value)s::jsonb),
           upd.lease_epoch, upd.attempts, clock.ts
      FROM upd, clock
        ON CONFLICT (run_id, step_key) DO NOTHING
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq, 'input.answered',
           jsonb_build_object('name', %(name)s, 'value', %(value)s::jsonb, 'by', %(by)s),
           clock.ts
      FROM upd, clock
), notify AS (
    SELECT runlease_notify_pending(%(channel_prefix)s, array(SELECT upd.pool FROM upd)) AS n
), {{events_notify}}
SELECT upd.id FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_inputs_list
-- A run's requests for input, oldest first (a tenant's own run only).
SELECT i.run_id, i.name, i.prompt, i.schema, i.requested_at, i.timeout_at, i.nonce,
       i.answered_at, i.outcome, i.value, i.answered_by, r.status AS run_status
  FROM agent_run_inputs i
  JOIN agent_runs r ON r.id = i.run_id
 WHERE i.run_id = %(id)s
   AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)
 ORDER BY i.requested_at, i.name
 LIMIT %(limit)s;


-- name: run_input_timeouts
-- timeout (the reaper's leader): requests whose time is up, a bounded
-- batch read from agent_run_inputs_due_idx (only unanswered requests that
-- can time out). A waiting run goes back to pending with the wait step's
-- result {"timed_out": true} (the agent's wait raises InputTimeout); a
-- request whose run is no longer waiting for it (cancelled meanwhile) is
-- closed. The run is locked first (SKIP LOCKED: one being answered or
-- cancelled is left to the next pass), as an answer locks it.
WITH {{clock}}, due AS (
    SELECT i.run_id, i.name
      FROM agent_run_inputs i, clock
     WHERE i.answered_at IS NULL AND i.timeout_at IS NOT NULL AND i.timeout_at <= clock.ts
     ORDER BY i.timeout_at
     LIMIT %(batch)s
), locked AS (
    SELECT r.id, r.status, due.name
      FROM agent_runs r JOIN due ON due.run_id = r.id
       FOR UPDATE OF r SKIP LOCKED
), upd AS (
    UPDATE agent_runs r
       SET status = 'pending', available_at = clock.ts,
           event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock, locked
     WHERE r.id = locked.id AND locked.status = 'waiting'
    RETURNING r.id, r.pool, r.tenant_id, r.event_seq, r.lease_epoch, r.attempts, locked.name
), ans AS (
    UPDATE agent_run_inputs i
       SET answered_at = clock.ts,
           outcome = CASE WHEN locked.status = 'waiting' THEN 'timed_out' ELSE 'closed' END,
           answered_by = CASE WHEN locked.status = 'waiting' THEN 'timeout' ELSE 'end' END
      FROM clock, locked
     WHERE i.run_id = locked.id AND i.name = locked.name AND i.answered_at IS NULL
), step AS (
    INSERT INTO agent_run_steps (run_id, step_key, result, lease_epoch, attempt, created_at)
    SELECT upd.id, 'input:' || upd.name, '{"timed_out": true}'::jsonb,
           upd.lease_epoch, upd.attempts, clock.ts
      FROM upd, clock
        ON CONFLICT (run_id, step_key) DO NOTHING
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq, 'input.timed_out', jsonb_build_object('name', upd.name),
           clock.ts
      FROM upd, clock
), notify AS (
    SELECT runlease_notify_pending(%(channel_prefix)s, array(SELECT upd.pool FROM upd)) AS n
), {{events_notify}}
SELECT upd.id, upd.pool, upd.tenant_id, upd.name
  FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_message_add
-- message: appended to an unfinished run's inbox (a tenant's own run only)
-- while it holds fewer than %(max_unread)s untaken and %(max_total)s in
-- all; its message.received event written; the run's holder woken on
-- %(channel)s (the run id). No row: not found, finished, or the inbox full
-- (the caller reads the run to tell which).
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET inbox_seq = r.inbox_seq + 1, event_seq = r.event_seq + 1
     WHERE r.id = %(id)s
       AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)
       AND r.status IN ('pending', 'leased', 'waiting')
       AND r.inbox_seq - r.inbox_read < %(max_unread)s
       AND r.inbox_seq < %(max_total)s
    RETURNING r.id, r.status, r.inbox_seq, r.event_seq
), msg AS (
    INSERT INTO agent_run_messages (run_id, seq, body, created_at)
    SELECT upd.id, upd.inbox_seq, %(body)s::jsonb, clock.ts FROM upd, clock
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq, 'message.received',
           jsonb_build_object('seq', upd.inbox_seq) || %(body)s::jsonb, clock.ts
      FROM upd, clock
), told AS (
    SELECT count(pg_notify(%(channel)s, upd.id::text)) AS n FROM upd WHERE upd.status = 'leased'
), {{events_notify}}
SELECT upd.id, upd.inbox_seq AS seq, upd.status
  FROM upd CROSS JOIN told CROSS JOIN events_notify;


-- name: run_inbox_state
-- Why a message was refused: the run's status and inbox counters.
SELECT r.status, r.inbox_seq, r.inbox_read
  FROM agent_runs r
 WHERE r.id = %(id)s
   AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text);


-- name: run_message_take
-- The agent takes message %(seq)s (the next after the ones it took), fenced:
-- committed as the step 'message:<seq>' with the cursor moved in the same
-- statement, so any later attempt replays it instead of taking it again.
-- No row: no such message yet. taken false: the lease is gone.
WITH m AS (
    SELECT seq, body, created_at FROM agent_run_messages
     WHERE run_id = %(id)s AND seq = %(seq)s
), upd AS (
    UPDATE agent_runs r
       SET inbox_read = greatest(r.inbox_read, %(seq)s)
      FROM m
     WHERE {{lease_held}}
    RETURNING r.id, r.lease_epoch, r.attempts
), step AS (
    INSERT INTO agent_run_steps (run_id, step_key, result, lease_epoch, attempt, created_at)
    SELECT upd.id, 'message:' || m.seq,
           m.body || jsonb_build_object('seq', m.seq, 'sent_at', m.created_at),
           upd.lease_epoch, upd.attempts, coalesce(%(now)s::timestamptz, now())
      FROM upd, m
        ON CONFLICT (run_id, step_key) DO NOTHING
)
SELECT m.body || jsonb_build_object('seq', m.seq, 'sent_at', m.created_at) AS message,
       EXISTS (SELECT 1 FROM upd) AS taken
  FROM m;


-- name: run_messages_list
-- A run's inbox, after seq %(after)s (a tenant's own run only); each with
-- whether the agent took it.
SELECT m.seq, m.body, m.created_at, m.seq <= r.inbox_read AS taken
  FROM agent_runs r
  JOIN agent_run_messages m ON m.run_id = r.id
 WHERE r.id = %(id)s
   AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)
   AND m.seq > %(after)s
 ORDER BY m.seq
 LIMIT %(limit)s;


-- name: server_key_get
-- A key the server keeps for itself, made by the first process that needs
-- it (every replica then reads the same one).
WITH made AS (
    INSERT INTO runlease_server_keys (name, secret) VALUES (%(name)s, %(secret)s)
        ON CONFLICT (name) DO NOTHING
    RETURNING secret
)
SELECT secret FROM made
 UNION ALL
SELECT secret FROM runlease_server_keys WHERE name = %(name)s
 LIMIT 1;
