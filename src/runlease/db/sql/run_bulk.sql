-- Bulk actions on runs (runlease.db.bulk): cancel, redrive and re-prioritise,
-- each one bounded batch of ids per statement, tenant-scoped, each affected
-- run given an audit event naming who and the bulk operation's id.


-- name: run_bulk_select
-- One batch of the named runs (ids) the action applies to, across tenants
-- (admin), newest first, after the cursor. A filter's batches come from
-- run_search.select_runs instead, as the listing's.
SELECT r.id
  FROM agent_runs r
 WHERE r.id = ANY (%(ids)s::uuid[])
   AND r.status = ANY (%(statuses)s::text[])
   AND (%(before)s::uuid IS NULL OR r.id < %(before)s::uuid)
 ORDER BY r.id DESC
 LIMIT %(limit)s;


-- name: run_bulk_select_tenant
-- The same within one tenant: another tenant's ids match nothing.
SELECT r.id
  FROM agent_runs r
 WHERE r.id = ANY (%(ids)s::uuid[])
   AND r.tenant_id = %(tenant)s
   AND r.status = ANY (%(statuses)s::text[])
   AND (%(before)s::uuid IS NULL OR r.id < %(before)s::uuid)
 ORDER BY r.id DESC
 LIMIT %(limit)s;


-- name: run_bulk_cancel
-- The Stop of run_request_cancel for a batch of ids: pending ones are
-- cancelled at once, leased ones get the request (their workers are told).
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET {{cancel_request}}
       AND r.id = ANY (%(ids)s::uuid[])
    RETURNING r.id, r.status, r.event_seq,
              jsonb_build_object('bulk_op', %(op)s::text, 'by', %(by)s::text) AS event_data
), {{cancel_told}}, {{events_notify}}
SELECT upd.id, upd.status FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_bulk_redrive
-- run_redrive for a batch of ids: dead runs back to pending, attempts reset.
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET status = 'pending', attempts = 0, finished_at = NULL, available_at = clock.ts,
           delayed = false, error_code = NULL, error_message = NULL,
           cancel_requested_at = NULL, event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock
     WHERE r.id = ANY (%(ids)s::uuid[])
       AND r.status = 'dead'
       AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)
    RETURNING r.id, r.pool, r.status, r.event_seq
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq, 'run.redriven',
           jsonb_build_object('bulk_op', %(op)s::text, 'by', %(by)s::text), clock.ts
      FROM upd, clock
), notify AS (
    SELECT runlease_notify_pending(%(channel_prefix)s, array(SELECT upd.pool FROM upd)) AS n
), {{events_notify}}
SELECT upd.id, upd.status FROM upd CROSS JOIN notify CROSS JOIN events_notify;


-- name: run_reprioritize
-- A pending run's new priority, within the tenant's band in its pool (the
-- store explains a missing row: not found, not pending, or outside the band).
WITH {{clock}}, was AS (
    SELECT r.id, r.priority FROM agent_runs r WHERE r.id = %(id)s
), upd AS (
    UPDATE agent_runs r
       SET priority = %(priority)s, event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock, was
     WHERE r.id = was.id
       AND r.status = 'pending'
       AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)
       AND %(priority)s BETWEEN
           coalesce((SELECT b.priority_min FROM agent_run_tenant_limits b
                      WHERE b.pool = r.pool AND b.tenant_id = r.tenant_id), -100)
           AND coalesce((SELECT b.priority_max FROM agent_run_tenant_limits b
                          WHERE b.pool = r.pool AND b.tenant_id = r.tenant_id), 100)
    RETURNING r.*, was.priority AS was_priority
), ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq, 'run.reprioritized',
           jsonb_build_object('from', upd.was_priority, 'to', upd.priority, 'by', %(by)s::text),
           clock.ts
      FROM upd, clock
), {{events_notify}}
SELECT upd.* FROM upd CROSS JOIN events_notify;
