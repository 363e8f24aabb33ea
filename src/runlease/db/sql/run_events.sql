-- Events of a run (agent_run_events).


-- name: run_event_record
-- Append events for a run, fenced by the lease. The run row's event_seq is
-- bumped in the same statement: that row lock orders concurrent writers, so
-- seq values become visible in order and a reader resuming after seq N never
-- misses one. NOTIFY carries ids only: "<run id>:<last seq>".
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET event_seq = r.event_seq + cardinality(%(kinds)s::text[])
     WHERE {{lease_held}}
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


-- name: run_events_fanout
-- The API's event fan-out: new events of many followed runs in one
-- statement, each run after its own seq and at most %(limit)s rows per run
-- (a busy run is read again at once). Every run asked for gives one row even
-- with no new event (seq NULL), carrying its status: a finished run is seen
-- in the same snapshot as its last events, so no per-stream status read is
-- needed; no row at all means the run is gone (retention).
SELECT w.id AS run_id, r.status, e.seq, e.kind, e.data, e.created_at
  FROM unnest(%(ids)s::uuid[], %(afters)s::bigint[]) AS w (id, after)
  JOIN agent_runs r ON r.id = w.id
  LEFT JOIN LATERAL (
      SELECT ev.seq, ev.kind, ev.data, ev.created_at
        FROM agent_run_events ev
       WHERE ev.run_id = w.id AND ev.seq > w.after
       ORDER BY ev.seq
       LIMIT %(limit)s
  ) e ON true
 ORDER BY w.id, e.seq;


-- name: run_events_ended
-- The final rows of runs the fan-out saw finish: one statement for all of
-- them, once per run (their streams' `end` events carry it).
SELECT * FROM agent_runs WHERE id = ANY (%(ids)s::uuid[]);


-- name: run_tool_output_used
-- What the run's tools have stored as events over all its attempts (the
-- events with a "stream": tool output and its notes): how many, and the
-- bytes of their text. Read once per attempt that streams a tool's output;
-- bounded by the run's own bound on them (worker/context.py).
SELECT count(*) AS events, coalesce(sum(octet_length(e.data ->> 'text')), 0)::bigint AS bytes
  FROM agent_run_events e
 WHERE e.run_id = %(id)s AND e.data ? 'stream';
