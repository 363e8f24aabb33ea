-- Usage: what agents report (tokens, cost), summed per run across attempts,
-- and the highest turn and tool-call counts; the usage log; the daily rollup.


-- name: run_usage_record
-- Add to a run's usage, fenced by its lease like every worker write, and log
-- tokens and cost (the tenant's token rate, the daily rollup). The columns
-- are in no index, so the update stays HOT. No row: the lease is gone.
WITH {{clock}}, upd AS (
    UPDATE agent_runs r
       SET input_tokens = r.input_tokens + %(input_tokens)s::bigint,
           output_tokens = r.output_tokens + %(output_tokens)s::bigint,
           cost = r.cost + %(cost)s::numeric,
           -- Ordinals, not sums: a replayed turn is not a new one (worker/budget.py).
           turns_used = greatest(r.turns_used, %(turns)s::integer),
           tool_calls_used = greatest(r.tool_calls_used, %(tool_calls)s::integer)
      FROM clock
     WHERE {{lease_held}}
    RETURNING r.id, r.pool, r.tenant_id, r.input_tokens, r.output_tokens, r.cost,
              r.turns_used, r.tool_calls_used
), log AS (
    INSERT INTO agent_run_usage_log (pool, tenant_id, run_id, input_tokens, output_tokens,
                                     cost, created_at)
    SELECT upd.pool, upd.tenant_id, upd.id, %(input_tokens)s::bigint,
           %(output_tokens)s::bigint, %(cost)s::numeric, clock.ts
      FROM upd, clock
     WHERE %(input_tokens)s::bigint + %(output_tokens)s::bigint > 0
        OR %(cost)s::numeric > 0
)
SELECT input_tokens, output_tokens, cost, turns_used, tool_calls_used FROM upd;


-- name: run_usage_get
SELECT input_tokens, output_tokens, cost, turns_used, tool_calls_used
  FROM agent_runs
 WHERE id = %(id)s;


-- name: usage_rollup
-- Fold a bounded batch of logged usage older than keep_s into the daily
-- rollup and delete it from the log, in one statement (SKIP LOCKED: two
-- leaders during a handover never fold a row twice).
WITH moved AS (
    DELETE FROM agent_run_usage_log l
     WHERE l.id IN (SELECT m.id FROM agent_run_usage_log m
                     WHERE m.created_at < coalesce(%(now)s::timestamptz, now())
                                          - make_interval(secs => %(keep_s)s::integer)
                     ORDER BY m.created_at
                     LIMIT %(batch)s
                       FOR UPDATE SKIP LOCKED)
    RETURNING l.tenant_id, l.pool, l.created_at, l.input_tokens, l.output_tokens, l.cost
), folded AS (
    INSERT INTO agent_usage_daily AS d (tenant_id, pool, day, input_tokens, output_tokens,
                                        cost, records)
    SELECT m.tenant_id, m.pool, (m.created_at AT TIME ZONE 'UTC')::date,
           sum(m.input_tokens), sum(m.output_tokens), sum(m.cost), count(*)
      FROM moved m
     GROUP BY 1, 2, 3
        ON CONFLICT (tenant_id, pool, day) DO UPDATE
       SET input_tokens = d.input_tokens + excluded.input_tokens,
           output_tokens = d.output_tokens + excluded.output_tokens,
           cost = d.cost + excluded.cost,
           records = d.records + excluded.records
)
SELECT count(*) AS moved FROM moved;


-- name: usage_report
-- Usage between two UTC days (inclusive), grouped by tenant, pool or day
-- ({{usage_rows}}: the rollup plus the log not folded yet).
WITH {{usage_rows}}
SELECT CASE %(group_by)s::text WHEN 'tenant' THEN r.tenant_id
                               WHEN 'pool' THEN r.pool
                               ELSE r.day::text END AS key,
       sum(r.input_tokens)::bigint AS input_tokens,
       sum(r.output_tokens)::bigint AS output_tokens,
       sum(r.cost) AS cost,
       sum(r.records)::bigint AS records
  FROM rows r
 GROUP BY 1
 ORDER BY 1
 LIMIT %(limit)s;
