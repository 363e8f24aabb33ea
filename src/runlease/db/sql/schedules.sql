-- Schedules (agent_run_schedules): cron ticks that enqueue runs.


-- name: schedule_lock_tenant
-- Creates of one tenant serialize on this transaction-level lock, so the
-- count in schedule_create (a later statement, with a later snapshot)
-- includes every create committed before: the bound cannot be passed.
SELECT pg_advisory_xact_lock(hashtextextended('runlease_schedules:' || %(tenant)s, 0)),
       coalesce(%(now)s::timestamptz, now()) AS now;


-- name: schedule_clock
-- The database's now (or the injected one), for the next tick after it.
SELECT coalesce(%(now)s::timestamptz, now()) AS now;


-- name: schedule_create
-- At most %(max)s schedules per tenant (after schedule_lock_tenant).
WITH {{clock}}
INSERT INTO agent_run_schedules AS s
       (id, tenant_id, name, cron, timezone, pool, template, overlap, paused, next_tick_at,
        created_at, updated_at)
SELECT %(id)s, %(tenant)s, %(name)s, %(cron)s, %(timezone)s, %(pool)s, %(template)s::jsonb,
       %(overlap)s, %(paused)s, %(next_tick_at)s, clock.ts, clock.ts
  FROM clock
 WHERE (SELECT count(*) FROM agent_run_schedules c WHERE c.tenant_id = %(tenant)s) < %(max)s
    ON CONFLICT (tenant_id, name) DO NOTHING
RETURNING s.*, true AS created;


-- name: schedule_count
SELECT count(*) AS n, bool_or(name = %(name)s) AS named
  FROM agent_run_schedules WHERE tenant_id = %(tenant)s;


-- name: schedule_get
SELECT * FROM agent_run_schedules
 WHERE id = %(id)s
   AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s::text);


-- name: schedule_list
-- By name within a tenant, tenants in order (admin): keyset pages on
-- (tenant_id, name), which the unique constraint's index serves.
SELECT * FROM agent_run_schedules
 WHERE (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s::text)
   AND (%(after_tenant)s::text IS NULL
        OR (tenant_id, name) > (%(after_tenant)s::text, %(after_name)s::text))
 ORDER BY tenant_id, name
 LIMIT %(limit)s;


-- name: schedule_set_paused
-- Pause or resume. Resuming starts from the next tick after now: the ticks
-- of the paused time are not caught up.
WITH {{clock}}
UPDATE agent_run_schedules s
   SET paused = %(paused)s,
       next_tick_at = CASE WHEN s.paused AND NOT %(paused)s THEN %(next_tick_at)s
                           ELSE s.next_tick_at END,
       updated_at = clock.ts
  FROM clock
 WHERE s.id = %(id)s
   AND (%(tenant)s::text IS NULL OR s.tenant_id = %(tenant)s::text)
RETURNING s.*;


-- name: schedule_delete
DELETE FROM agent_run_schedules
 WHERE id = %(id)s
   AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s::text)
RETURNING id;


-- name: schedule_due
-- Schedules whose tick is due, locked for this transaction: another
-- scheduler (a leader that has not yet noticed it lost) skips them, and
-- sees them again only after this one moved next_tick_at on.
SELECT s.*, clock.ts AS now,
       (SELECT r.status FROM agent_runs r WHERE r.id = s.last_run_id) AS last_run_status
  FROM agent_run_schedules s, (SELECT coalesce(%(now)s::timestamptz, now()) AS ts) clock
 WHERE NOT s.paused
   AND s.next_tick_at <= clock.ts
 ORDER BY s.next_tick_at
 LIMIT %(batch)s
   FOR UPDATE OF s SKIP LOCKED;


-- name: schedule_advance
UPDATE agent_run_schedules
   SET next_tick_at = %(next_tick_at)s, last_tick_at = %(tick)s,
       last_run_id = coalesce(%(run_id)s, last_run_id), last_error = %(error)s,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(id)s;
