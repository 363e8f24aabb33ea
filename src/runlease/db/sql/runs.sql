-- Transitions of agent_runs, one named statement each (see core/states.py).
--
-- Every statement takes %(now)s: NULL in production, so the server's now() is
-- the clock; tests pass an instant to move time without sleeping.
-- Worker writes carry the fencing triple (locked_by, lease_epoch, 'leased'),
-- and need the holder's incarnation live by the database clock (a run's
-- lease lives while its holder's row in agent_run_workers does): a write
-- that arrives late (a statement stuck on a cut network, a worker whose loop
-- stalled) never lands on an expired lease, reaped yet or not.
-- A single run's fence is written once, the part {{lease_held}} (parts.sql).
-- The status test is written `(r.status = 'leased') IS TRUE` (the same for a
-- NOT NULL column): the planner cannot prove from it the predicate of
-- agent_runs_leased_idx, so it cannot choose that index. Statistics taken
-- when few runs were leased make that index look nearly empty and, with the
-- plain form, every fenced write scanned all the fleet's leased runs for its
-- one row instead of going by primary key (test_schema.py proves the plans).


-- name: run_enqueue
-- One run or a batch (of one or many pools), as one multi-row INSERT from
-- one JSON array of runs (one parameter: cheaper to send than parallel arrays).
-- Fairness: a tenant's runs join the pool's fair order at max(the order's
-- head, the end of the tenant's own pending line), whatever their priority,
-- so a tenant with 10 runs is interleaved with one that has 10,000 instead of
-- queued behind them (runs in backoff hold no place in these lines), and a
-- high priority buys no place ahead of another tenant (it orders the tenant's own runs; see runlease_claim). A run whose
-- priority is outside the tenant's band (agent_run_tenant_limits), or whose
-- pool does not exist, is not inserted; the store explains the missing row.
-- A repeated idempotency key returns the existing run (inserted = false)
-- when the input is the same and no row when it differs.
-- A run for later (run_at / delay_s, by the database clock) is inserted
-- delayed: out of the claim's indexes until runlease_claim promotes it.
WITH {{clock}}, {{enqueue_insert}}
    RETURNING r.*, (r.xmax = 0) AS inserted
), {{enqueue_after}}
SELECT ins.* FROM ins CROSS JOIN notify;


-- part: enqueue_insert
-- The CTEs of run_enqueue after {{clock}} up to the RETURNING of `ins`,
-- which each statement writes (run_enqueue returns the rows whole,
-- run_enqueue_batch in run_batch.sql what a batch's answer needs of them);
-- then `), {{enqueue_after}}`.
input AS (
    SELECT i.*,
           greatest(coalesce(i.run_at, clock.ts + make_interval(secs => i.delay_s), clock.ts),
                    clock.ts) AS due
      FROM jsonb_to_recordset(%(runs)s::jsonb)
           AS i (ord integer, id uuid, pool text, tenant_id text, priority integer,
                 max_attempts integer, budget_json jsonb, input_json jsonb,
                 idempotency_key text, labels jsonb, run_at timestamptz, delay_s float8,
                 backoff_base_s integer, backoff_cap_s integer, non_retryable_codes text[],
                 traceparent text),
           clock
), lanes AS MATERIALIZED (
    -- MATERIALIZED: once per (pool, tenant) of the batch. Inlined, the
    -- planner evaluated these subqueries once per inserted row, and a batch
    -- of 1,000 read its tenant's whole pending line 1,000 times (seconds,
    -- growing with the line: the bulk stalls of docs/benchmarks.md).
    -- ORDER BY ... LIMIT 1, not max(): one descent of
    -- agent_runs_pending_tenant_idx whatever the statistics say.
    SELECT l.pool, l.tenant_id,
           greatest(
               (SELECT r.fair_seq + 1 FROM agent_runs r
                 WHERE r.pool = l.pool AND r.status = 'pending' AND NOT r.delayed
                   AND r.tenant_id = l.tenant_id
                 ORDER BY r.fair_seq DESC LIMIT 1),
               coalesce(
                   -- The pool's head. fair_seq >= 0 (always true) names
                   -- agent_runs_claim_idx, the pool's fair order (migration
                   -- 0015 says why). A pending run not delayed is due (the
                   -- promotion clears delayed only when due), so no time is
                   -- tested here: one with it let stale statistics pick the
                   -- index of due runs and sort the whole burst.
                   (SELECT r.fair_seq FROM agent_runs r
                     WHERE r.pool = l.pool AND r.status = 'pending' AND NOT r.delayed
                       AND r.fair_seq >= 0
                     ORDER BY r.fair_seq LIMIT 1),
                   0)) AS base,
           pool.name AS pool_name, pool.max_attempts AS pool_attempts,
           coalesce(band.priority_min, -100) AS lo, coalesce(band.priority_max, 100) AS hi
      FROM (SELECT DISTINCT pool, tenant_id FROM input) l
      -- The pool (an unknown one has no lane: its runs are not inserted)
      -- and the tenant's band, once per lane too, not once per run.
      JOIN agent_run_pools pool ON pool.name = l.pool
      LEFT JOIN agent_run_tenant_limits band
        ON band.pool = l.pool AND band.tenant_id = l.tenant_id
), ins AS (
    INSERT INTO agent_runs AS r
           (id, pool, tenant_id, priority, fair_seq, max_attempts, budget_json, input_json,
            idempotency_key, available_at, created_at, updated_at, delayed, labels,
            backoff_base_s, backoff_cap_s, non_retryable_codes, traceparent)
    SELECT i.id, lanes.pool_name, i.tenant_id, i.priority,
           lanes.base + row_number() OVER (PARTITION BY i.pool, i.tenant_id ORDER BY i.ord) - 1,
           coalesce(i.max_attempts, lanes.pool_attempts), i.budget_json, i.input_json,
           i.idempotency_key, i.due, clock.ts, clock.ts, i.due > clock.ts,
           coalesce(i.labels, '{}'::jsonb),
           i.backoff_base_s, i.backoff_cap_s, i.non_retryable_codes, i.traceparent
      FROM input i
      JOIN lanes USING (pool, tenant_id)
     CROSS JOIN clock
     WHERE i.priority BETWEEN lanes.lo AND lanes.hi
     ORDER BY i.ord
        ON CONFLICT (pool, tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL
        DO UPDATE SET idempotency_key = excluded.idempotency_key
           WHERE r.input_json = excluded.input_json


-- part: enqueue_after
-- The CTEs of run_enqueue after `ins`: they read its id, pool, tenant_id,
-- labels, delayed and inserted.
indexed AS (
    INSERT INTO agent_run_tenant_index (tenant_id, run_id)
    SELECT ins.tenant_id, ins.id FROM ins WHERE ins.inserted
), labelled AS (
    INSERT INTO agent_run_labels (tenant_id, key, value, run_id)
    SELECT ins.tenant_id, l.key, l.value, ins.id
      FROM ins CROSS JOIN LATERAL jsonb_each_text(ins.labels) l
     WHERE ins.inserted
), notify AS (
    -- Runs for later wake nobody: the claim that promotes them finds them.
    -- notify false: the caller wakes the pool after the commit instead (a
    -- NOTIFY in the transaction serializes every notifying commit).
    SELECT count(pg_notify(%(channel_prefix)s || p.pool, p.pool)) AS n
      FROM (SELECT DISTINCT ins.pool FROM ins
             WHERE ins.inserted AND NOT ins.delayed AND %(notify)s::boolean) p
)


-- name: run_get_by_keys
SELECT * FROM agent_runs
 WHERE pool = %(pool)s AND tenant_id = %(tenant)s AND idempotency_key = ANY (%(keys)s::text[]);


-- name: run_traceparents
-- The stored trace context of runs just claimed, read only by a worker that
-- traces (tracing.py): the claim itself does not carry it.
SELECT id, traceparent FROM agent_runs
 WHERE id = ANY (%(ids)s::uuid[]) AND traceparent IS NOT NULL;


-- name: run_claim
-- The logic lives in runlease_claim() and its stages (functions.sql): the
-- tenant-cap path needs a fresh snapshot after taking its locks, which one
-- statement cannot have. Only what a worker needs comes back, by name, JSON
-- as text: parsing each claimed row is the worker's hot path (see
-- LeaseStore.claim). lease_until: the incarnation's expiry when it claimed.
SELECT id, pool, tenant_id, priority, attempts, max_attempts, lease_epoch, lease_until,
       cancel_requested_at, input_json::text AS input_json, budget_json::text AS budget_json,
       created_at, available_at, updated_at, thread_id
  FROM runlease_claim(%(pool)s, %(worker)s, %(n)s, %(now)s::timestamptz)
 ORDER BY nth;


-- name: run_ack
-- Finish runs successfully, one or many in one statement. The arrays are
-- parallel; array_position pairs each row with its epoch and result without
-- a join, so the plan is one primary-key scan. A finished run frees a slot
-- of its tenant: runlease_notify_freed wakes the claimers of a pool with
-- tenant limits.
WITH upd AS (
    UPDATE agent_runs r
       SET status = 'done', locked_by = NULL,
           error_code = NULL, error_message = NULL,  -- an earlier attempt's; events keep it
           result_json = CASE WHEN %(results)s::jsonb[] IS NOT NULL
                              THEN (%(results)s::jsonb[])[array_position(%(ids)s::uuid[], r.id)]
                         END,
           finished_at = coalesce(%(now)s::timestamptz, now()),
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE r.id = ANY (%(ids)s::uuid[])
       AND r.lease_epoch = (%(epochs)s::bigint[])[array_position(%(ids)s::uuid[], r.id)]
       AND r.locked_by = %(worker)s
       AND (r.status = 'leased') IS TRUE
       AND {{holder_live}}
    RETURNING r.id, r.pool, r.event_seq
), notify AS (
    SELECT runlease_notify_freed(%(channel_prefix)s, array(SELECT upd.pool FROM upd)) AS n
), events_notify AS (
    SELECT runlease_notify_events(array_agg(upd.id), array_agg(upd.event_seq)) AS n FROM upd
)
SELECT upd.id FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_nack
-- A retryable failure: back to pending after min(cap, base * 2^(attempts-1))
-- s by the run's retry policy (NULL: base 5, cap 300), or the failure's own
-- retry-after when longer, computed here by the database clock; dead once
-- attempts reach max_attempts, or at once when the error code is one of the
-- run's non_retryable_codes; cancelled if a cancel was requested meanwhile
-- (a cancelled run is never retried).
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET status = CASE WHEN r.cancel_requested_at IS NOT NULL THEN 'cancelled'
                         WHEN r.attempts < r.max_attempts
                              AND NOT coalesce(%(error_code)s::text = ANY (r.non_retryable_codes),
                                               false) THEN 'pending'
                         ELSE 'dead' END,
           -- In backoff: out of the claim's indexes until runlease_claim
           -- finds its time has come. (The retry test is repeated: each
           -- must read the row's latest version, which a CTE would not.)
           delayed = (r.cancel_requested_at IS NULL AND r.attempts < r.max_attempts
                      AND NOT coalesce(%(error_code)s::text = ANY (r.non_retryable_codes),
                                       false)),
           available_at = CASE WHEN r.cancel_requested_at IS NULL
                                    AND r.attempts < r.max_attempts
                                    AND NOT coalesce(%(error_code)s::text
                                                     = ANY (r.non_retryable_codes), false)
                               THEN clock.ts + make_interval(
                                        secs => greatest(
                                            least(coalesce(r.backoff_cap_s, 300),
                                                  coalesce(r.backoff_base_s, 5)
                                                  * power(2, least(r.attempts - 1, 60))),
                                            coalesce(%(retry_after_s)s::float8, 0)))
                               ELSE r.available_at END,
           finished_at = CASE WHEN r.cancel_requested_at IS NULL
                                   AND r.attempts < r.max_attempts
                                   AND NOT coalesce(%(error_code)s::text
                                                    = ANY (r.non_retryable_codes), false)
                              THEN NULL ELSE clock.ts END,
           locked_by = NULL,
           error_code = %(error_code)s, error_message = %(error_message)s,
           event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock
     WHERE {{lease_held}}
    RETURNING r.id, r.pool, r.status, r.attempts, r.max_attempts, r.available_at, r.event_seq,
              r.error_code, r.error_message
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq, 'run.' || CASE upd.status WHEN 'pending' THEN 'retrying'
                                                            ELSE upd.status END,
           jsonb_build_object('attempt', upd.attempts, 'max_attempts', upd.max_attempts,
                              'error_code', upd.error_code, 'error_message', upd.error_message,
                              'retry_at', CASE WHEN upd.status = 'pending'
                                               THEN upd.available_at END),
           clock.ts
      FROM upd, clock
), notify AS (
    SELECT runlease_notify_freed(%(channel_prefix)s, array(SELECT upd.pool FROM upd)) AS n
), {{events_notify}}
SELECT id, status, attempts, available_at FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_fail
-- A fatal failure: dead at once, whatever attempts remain.
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET status = 'dead', finished_at = clock.ts, locked_by = NULL,
           error_code = %(error_code)s, error_message = %(error_message)s,
           event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock
     WHERE {{lease_held}}
    RETURNING r.id, r.pool, r.status, r.attempts, r.event_seq, r.error_code, r.error_message
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq, 'run.dead',
           jsonb_build_object('attempt', upd.attempts, 'error_code', upd.error_code,
                              'error_message', upd.error_message),
           clock.ts
      FROM upd, clock
), notify AS (
    SELECT runlease_notify_freed(%(channel_prefix)s, array(SELECT upd.pool FROM upd)) AS n
), {{events_notify}}
SELECT id, status, attempts FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_release
-- Drain: hand runs back at once without charging the attempt (a clean
-- shutdown is not a failure). A run whose cancel was requested ends cancelled.
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET status = CASE WHEN r.cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
           attempts = CASE WHEN r.cancel_requested_at IS NULL THEN r.attempts - 1
                           ELSE r.attempts END,
           finished_at = CASE WHEN r.cancel_requested_at IS NOT NULL THEN clock.ts END,
           available_at = clock.ts, locked_by = NULL,
           event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock, unnest(%(ids)s::uuid[], %(epochs)s::bigint[]) AS h (id, epoch)
     WHERE r.id = ANY (%(ids)s::uuid[])
       AND r.id = h.id
       AND r.lease_epoch = h.epoch
       AND r.locked_by = %(worker)s
       AND (r.status = 'leased') IS TRUE
       AND {{holder_live}}
    RETURNING r.id, r.pool, r.status, r.attempts, r.event_seq
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq,
           CASE upd.status WHEN 'pending' THEN 'run.released' ELSE 'run.cancelled' END,
           jsonb_build_object('attempts', upd.attempts), clock.ts
      FROM upd, clock
), notify AS (
    SELECT runlease_notify_pending(%(channel_prefix)s,
                                   array(SELECT upd.pool FROM upd WHERE upd.status = 'pending')) AS n
), {{events_notify}}
SELECT upd.id, upd.status FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_request_cancel
-- The user's Stop. One UPDATE whose CASE is evaluated on the latest row
-- version: if a claim commits while this waits for the row, the run is seen
-- as leased and gets the request, instead of the request being lost.
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET {{cancel_request}}
       AND r.id = %(id)s
    RETURNING r.id, r.status, r.event_seq, '{}'::jsonb AS event_data
), {{cancel_told}}, {{events_notify}}
SELECT upd.id, upd.status FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_finalize_cancel
-- The worker stopped the run after seeing the request.
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET status = 'cancelled', finished_at = clock.ts, locked_by = NULL,
           event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock
     WHERE {{lease_held}}
       AND r.cancel_requested_at IS NOT NULL
    RETURNING r.id, r.pool, r.event_seq, r.attempts, r.cancel_requested_at
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq, 'run.cancelled', jsonb_build_object('attempt', upd.attempts),
           clock.ts
      FROM upd, clock
), notify AS (
    SELECT runlease_notify_freed(%(channel_prefix)s, array(SELECT upd.pool FROM upd)) AS n
), {{events_notify}}
-- The Stop's whole latency, by the database clock: request to cancelled.
SELECT upd.id, extract(epoch FROM clock.ts - upd.cancel_requested_at)::float8 AS latency_s
  FROM upd, clock CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_reap
-- Incarnations that stopped renewing and the leases they held, in one
-- bounded batch: expired incarnations end (they can never renew again), and
-- the runs of every holder that cannot renew (ended, now or before, or
-- without a row at all) go back to pending, or dead with 'lease_expired'
-- when no attempt is left, or cancelled when a cancel was requested.
-- One statement, so an incarnation ended here has its runs requeued in the
-- same transaction (those past the batch: by the next statements, which
-- find its row ended). The ending UPDATE re-checks its WHERE on the newest
-- row version: a renewal that committed first keeps the incarnation live,
-- and its runs are not touched (an expired row of this snapshot counts only
-- once this statement has ended it). Each run is re-checked and locked by
-- primary key (SKIP LOCKED passes over one being acked right now), its
-- holder tested again on the newest version: a run requeued and claimed by
-- someone else meanwhile is not theirs to reap.
-- Flat in live leases: the holders come from a loose index scan of
-- agent_runs_holder_idx (one descent each), and only the runs of holders
-- that cannot renew are read.
WITH RECURSIVE {{clock}}, ended AS (
    UPDATE agent_run_workers w
       SET ended_at = clock.ts
      FROM clock
     WHERE w.id = ANY (ARRAY(SELECT x.id FROM agent_run_workers x, clock
                              WHERE x.ended_at IS NULL AND x.expires_at < clock.ts
                              LIMIT %(batch)s))
       AND w.ended_at IS NULL AND w.expires_at < clock.ts
    RETURNING w.id
), holders AS (
    -- locked_by is set exactly while leased, and lease_epoch > 0 then (the
    -- CHECKs); that predicate and no status, so only agent_runs_holder_idx
    -- serves these (migration 0015 says why).
    (SELECT r.locked_by FROM agent_runs r
      WHERE r.locked_by IS NOT NULL AND r.lease_epoch > 0
      ORDER BY r.locked_by LIMIT 1)
    UNION ALL
    SELECT (SELECT r.locked_by FROM agent_runs r
             WHERE r.locked_by > h.locked_by AND r.lease_epoch > 0
             ORDER BY r.locked_by LIMIT 1)
      FROM holders h
     WHERE h.locked_by IS NOT NULL
), gone AS (
    SELECT h.locked_by AS id
      FROM holders h
     WHERE h.locked_by IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM agent_run_workers w
                        WHERE w.id = h.locked_by AND w.ended_at IS NULL)
    UNION
    SELECT ended.id FROM ended
), candidates AS (
    SELECT c.id
      FROM gone g
     CROSS JOIN LATERAL (
            SELECT r.id FROM agent_runs r
             WHERE r.locked_by = g.id AND r.lease_epoch > 0
             ORDER BY r.locked_by, r.id
             LIMIT %(batch)s
           ) c
), expired AS (
    SELECT r.id
      FROM agent_runs r
     WHERE r.id = ANY (ARRAY(SELECT candidates.id FROM candidates))
       AND (r.status = 'leased') IS TRUE
       AND r.locked_by = ANY (ARRAY(SELECT gone.id FROM gone))
     LIMIT %(batch)s
       FOR UPDATE OF r SKIP LOCKED
), upd AS (
    UPDATE agent_runs r
       SET status = CASE WHEN r.cancel_requested_at IS NOT NULL THEN 'cancelled'
                         WHEN r.attempts >= r.max_attempts THEN 'dead'
                         ELSE 'pending' END,
           finished_at = CASE WHEN r.cancel_requested_at IS NOT NULL
                                   OR r.attempts >= r.max_attempts
                              THEN clock.ts END,
           error_code = CASE WHEN r.cancel_requested_at IS NULL THEN 'lease_expired'
                             ELSE r.error_code END,
           error_message = CASE WHEN r.cancel_requested_at IS NULL
                                THEN 'the lease expired: its worker stopped renewing it'
                                ELSE r.error_message END,
           available_at = clock.ts, locked_by = NULL,
           event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock
     WHERE r.id = ANY (ARRAY(SELECT expired.id FROM expired))
    RETURNING r.id, r.pool, r.tenant_id, r.status, r.attempts, r.event_seq
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq, 'run.lease_expired',
           jsonb_build_object('attempt', upd.attempts, 'status', upd.status), clock.ts
      FROM upd, clock
), health AS (
    -- The console's lease expiries of the last hour (agent_run_pool_health).
    INSERT INTO agent_run_pool_health AS h (pool, minute, lease_expiries)
    SELECT upd.pool, date_trunc('minute', clock.ts), count(*)
      FROM upd, clock
     GROUP BY 1, 2
     ORDER BY 1  -- one lock order, should two leaders overlap
        ON CONFLICT (pool, minute)
        DO UPDATE SET lease_expiries = h.lease_expiries + excluded.lease_expiries
), notify AS (
    SELECT runlease_notify_pending(%(channel_prefix)s, array(SELECT upd.pool FROM upd)) AS n
), {{events_notify}}
SELECT upd.id, upd.pool, upd.tenant_id, upd.status, NULL::text AS ended
  FROM upd CROSS JOIN notify CROSS JOIN events_notify
UNION ALL
SELECT NULL, NULL, NULL, NULL, ended.id FROM ended;


-- name: run_redrive
-- Operations: a dead run goes back to pending with its attempts reset.
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET status = 'pending', attempts = 0, finished_at = NULL, available_at = clock.ts,
           error_code = NULL, error_message = NULL, cancel_requested_at = NULL,
           event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock
     WHERE r.id = %(id)s
       AND r.status = 'dead'
       AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)
    RETURNING r.*
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq, 'run.redriven', '{}'::jsonb, clock.ts FROM upd, clock
), notify AS (
    SELECT runlease_notify_pending(%(channel_prefix)s, array(SELECT upd.pool FROM upd)) AS n
), {{events_notify}}
SELECT upd.* FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_get
-- With its lease's expiry: the holder incarnation's.
SELECT r.*, (SELECT w.expires_at FROM agent_run_workers w
              WHERE w.id = r.locked_by) AS locked_until
  FROM agent_runs r
 WHERE r.id = %(id)s
   AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text);


-- name: run_list
-- Keyset pagination, newest first: the cursor is the last id of the previous
-- page. Operators' view across tenants walks the primary key. With each
-- lease's expiry: the holder incarnation's.
SELECT r.*, (SELECT w.expires_at FROM agent_run_workers w
              WHERE w.id = r.locked_by) AS locked_until
  FROM agent_runs r
 WHERE (%(pool)s::text IS NULL OR pool = %(pool)s::text)
   AND (%(status)s::text IS NULL OR status = %(status)s::text)
   AND (%(before)s::uuid IS NULL OR id < %(before)s::uuid)
 ORDER BY id DESC
 LIMIT %(limit)s;


-- name: run_list_tenant
-- One tenant's runs, newest first, through the tenant's index rows.
SELECT r.*, (SELECT w.expires_at FROM agent_run_workers w
              WHERE w.id = r.locked_by) AS locked_until
  FROM agent_run_tenant_index t
  JOIN agent_runs r ON r.id = t.run_id
 WHERE t.tenant_id = %(tenant)s
   AND (%(before)s::uuid IS NULL OR t.run_id < %(before)s::uuid)
   AND (%(pool)s::text IS NULL OR r.pool = %(pool)s::text)
   AND (%(status)s::text IS NULL OR r.status = %(status)s::text)
 ORDER BY t.run_id DESC
 LIMIT %(limit)s;


-- name: run_retention_delete
-- Delete finished runs (and, by cascade, their events and steps) that
-- finished before the cutoff, in one bounded batch: an operator's purge
-- across pools. Each pool with finished runs (a loose scan of
-- agent_runs_finished_idx, one descent per pool) gives its oldest finished
-- runs from that index: only what is deleted is read, never live runs.
WITH RECURSIVE cutoff AS (
    SELECT coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention_s)s) AS ts
), pools AS (
    (SELECT r.pool FROM agent_runs r
      WHERE r.finished_at IS NOT NULL
      ORDER BY r.pool LIMIT 1)
    UNION ALL
    SELECT (SELECT r.pool FROM agent_runs r
             WHERE r.finished_at IS NOT NULL AND r.pool > p.pool
             ORDER BY r.pool LIMIT 1)
      FROM pools p
     WHERE p.pool IS NOT NULL
), targets AS (
    SELECT p.pool, cutoff.ts AS cutoff FROM pools p, cutoff WHERE p.pool IS NOT NULL
), {{delete_doomed}}
SELECT id FROM deleted;


-- name: run_retention_by_pool
-- Retention as each pool sets it: delete runs that finished more than their
-- pool's retention_s ago (0 keeps them), with their events and steps by
-- cascade, in one bounded batch across pools. Each pool's oldest finished
-- runs come from agent_runs_finished_idx: only what is deleted is read,
-- never live runs (however old their ids).
WITH {{clock}}, targets AS (
    SELECT p.name AS pool, clock.ts - make_interval(secs => p.retention_s) AS cutoff
      FROM agent_run_pools p, clock
     WHERE p.retention_s > 0
), {{delete_doomed}}
SELECT id, pool FROM deleted;
