-- Parts of statements that many share, each written once: a statement says
-- `{{name}}` where one goes, and db/queries.py fills it in, so what is sent
-- spells it all out.


-- part: clock
-- The statement's instant, a CTE named clock (WITH {{clock}}, ...): the
-- %(now)s a test passes, or NULL and the server's now() in production.
clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS ts
)


-- part: events_notify
-- Wakes the streams of the runs the statement's `upd` wrote an event for
-- (one NOTIFY each, runlease_notify_events): a CTE named events_notify,
-- which the final SELECT cross-joins so that it runs.
events_notify AS (
    SELECT runlease_notify_events(array_agg(upd.id), array_agg(upd.event_seq)) AS n FROM upd
)


-- part: lease_held
-- A worker's write to one run (%(id)s) lands only while the run's lease is
-- still the caller's: the fencing triple (locked_by, lease_epoch, 'leased')
-- and the holder's incarnation live by the database clock ({{holder_live}}),
-- so a write that arrives late never lands on an expired lease, reaped yet
-- or not. It goes in each fenced statement's own WHERE: an UPDATE re-checks
-- the run's part on the newest row version, a locking read (FOR SHARE)
-- likewise (runs.sql's head says why the IS TRUE).
r.id = %(id)s
       AND r.lease_epoch = %(epoch)s
       AND r.locked_by = %(worker)s
       AND (r.status = 'leased') IS TRUE
       AND {{holder_live}}


-- part: holder_live
-- The incarnation %(worker)s is live: its row not ended and unexpired by the
-- database clock (a run's lease lives while its holder's incarnation does).
-- Uncorrelated, so evaluated once per statement, by primary key. The row is
-- not locked: a reap that ends the incarnation and requeues the run commits
-- before the write (its run row no longer matches the fence) or after it
-- (the run is no longer leased when the reap re-checks it).
EXISTS (SELECT 1 FROM agent_run_workers w
                WHERE w.id = %(worker)s AND w.ended_at IS NULL
                  AND w.expires_at > coalesce(%(now)s::timestamptz, now()))


-- part: pool_leased
-- The leased runs of %(pool)s by tenant, a CTE named leased (tenant_id, n),
-- read from agent_runs_leased_idx: bounded by what is in flight.
leased AS (
    SELECT r.tenant_id, count(*) AS n
      FROM agent_runs r
     WHERE r.pool = %(pool)s AND r.status = 'leased'
     GROUP BY r.tenant_id
)


-- part: cancel_request
-- The user's Stop, as an UPDATE from its SET to its WHERE's tests but the
-- statement's own choice of runs (which follows: AND r.id ...): a pending or
-- waiting run is cancelled at once, a leased one gets the request, which its worker is
-- told of; a tenant's token reaches its own runs only. The CASEs read the
-- newest row version: a claim that commits meanwhile is seen as leased.
status = CASE WHEN r.status IN ('pending', 'waiting') THEN 'cancelled' ELSE r.status END,
           finished_at = CASE WHEN r.status IN ('pending', 'waiting') THEN clock.ts
                              ELSE r.finished_at END,
           cancel_requested_at = coalesce(r.cancel_requested_at, clock.ts),
           event_seq = r.event_seq + 1, updated_at = clock.ts
      FROM clock
     WHERE r.status IN ('pending', 'leased', 'waiting')
       AND (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s::text)


-- part: cancel_told
-- After the Stop (cancel_request) of the runs in `upd` (id, status,
-- event_seq, event_data): each run's event, run.cancelled or (a leased run)
-- run.cancel_requested, its data upd.event_data; and for a leased run a
-- NOTIFY on %(channel)s that tells its worker. CTEs ev and notify (n), which
-- the final SELECT cross-joins so that it runs.
ev AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq,
           CASE upd.status WHEN 'cancelled' THEN 'run.cancelled' ELSE 'run.cancel_requested' END,
           upd.event_data, clock.ts
      FROM upd, clock
), notify AS (
    SELECT count(pg_notify(%(channel)s, upd.id::text)) AS n FROM upd WHERE upd.status = 'leased'
)


-- part: delete_doomed
-- Retention: deletes, in one bounded batch, the runs that finished before
-- their pool's cutoff, for the pools of the CTE targets (pool, cutoff), with
-- their tenant-index and label rows (their events and steps go by cascade).
-- Each pool's oldest finished runs come from agent_runs_finished_idx: only
-- what is deleted is read, never live runs. CTEs doomed (id), deleted (id,
-- pool, tenant_id, labels), unindexed and unlabelled.
doomed AS (
    SELECT d.id
      FROM targets t
     CROSS JOIN LATERAL (
            SELECT r.id FROM agent_runs r
             WHERE r.pool = t.pool AND r.finished_at IS NOT NULL
               AND r.finished_at < t.cutoff
             ORDER BY r.finished_at
             LIMIT %(batch)s
               FOR UPDATE OF r SKIP LOCKED
           ) d
     LIMIT %(batch)s
), deleted AS (
    -- By primary key, whatever the planner guesses of the batch's size.
    DELETE FROM agent_runs r WHERE r.id = ANY (ARRAY(SELECT doomed.id FROM doomed))
    RETURNING r.id, r.pool, r.tenant_id, r.labels
), unindexed AS (
    DELETE FROM agent_run_tenant_index t USING deleted
     WHERE t.tenant_id = deleted.tenant_id AND t.run_id = deleted.id
), unlabelled AS (
    DELETE FROM agent_run_labels l
     USING deleted CROSS JOIN LATERAL jsonb_each_text(deleted.labels) d
     WHERE l.tenant_id = deleted.tenant_id AND l.key = d.key AND l.value = d.value
       AND l.run_id = deleted.id
)


-- part: usage_rows
-- Usage records between the UTC days %(from)s and %(to)s (inclusive), of
-- %(tenant)s and %(pool)s when given (NULL: all): the daily rollup plus the
-- log not folded yet, in one snapshot (a row being folded is counted once).
-- CTEs `bounds` and `rows` (tenant_id, pool, day, input_tokens,
-- output_tokens, cost, records).
bounds AS (
    SELECT %(from)s::date::timestamp AT TIME ZONE 'UTC' AS lo,
           (%(to)s::date + 1)::timestamp AT TIME ZONE 'UTC' AS hi
), rows AS (
    SELECT d.tenant_id, d.pool, d.day, d.input_tokens, d.output_tokens, d.cost, d.records
      FROM agent_usage_daily d
     WHERE d.day BETWEEN %(from)s::date AND %(to)s::date
       AND (%(tenant)s::text IS NULL OR d.tenant_id = %(tenant)s::text)
       AND (%(pool)s::text IS NULL OR d.pool = %(pool)s::text)
    UNION ALL
    SELECT l.tenant_id, l.pool, (l.created_at AT TIME ZONE 'UTC')::date, l.input_tokens,
           l.output_tokens, l.cost, 1
      FROM agent_run_usage_log l, bounds b
     WHERE l.created_at >= b.lo AND l.created_at < b.hi
       AND (%(tenant)s::text IS NULL OR l.tenant_id = %(tenant)s::text)
       AND (%(pool)s::text IS NULL OR l.pool = %(pool)s::text)
)
