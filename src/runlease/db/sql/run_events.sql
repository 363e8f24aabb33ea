-- Events of a run (agent_run_events).


-- name: run_event_record
-- Append events for a run, fenced by the lease. The run row's event_seq is
-- bumped in the same statement: that row lock orders concurrent writers, so
-- seq values become visible in order and a reader resuming after seq N never
-- misses one. NOTIFY carries ids only: "<run id>:<last seq>".
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS ts
), upd AS (
    UPDATE agent_runs r
       SET event_seq = r.event_seq + cardinality(%(kinds)s::text[])
     WHERE r.id = %(id)s
       AND r.lease_epoch = %(epoch)s
       AND r.locked_by = %(worker)s
       AND (r.status = 'leased') IS TRUE
       AND r.locked_until > coalesce(%(now)s::timestamptz, now())
    RETURNING r.id, r.event_seq
), ins AS (
    INSERT INTO agent_run_events (run_id, seq, kind, data, created_at)
    SELECT upd.id, upd.event_seq - cardinality(%(kinds)s::text[]) + e.ord, e.kind, e.data, clock.ts
      FROM upd, clock,
           unnest(%(kinds)s::text[], %(datas)s::jsonb[]) WITH ORDINALITY AS e (kind, data, ord)
), notify AS (
    SELECT count(pg_notify(%(channel)s, upd.id::text || ':' || upd.event_seq)) AS n FROM upd
)
SELECT upd.event_seq FROM upd CROSS JOIN notify;


-- name: run_events_after
SELECT run_id, seq, kind, data, created_at
  FROM agent_run_events
 WHERE run_id = %(id)s AND seq > %(after)s
 ORDER BY seq
 LIMIT %(limit)s;
