-- Statements of a bulk submit (POST /v1/runs/batch, db/enqueue_batch.py).


-- name: run_enqueue_batch
-- run_enqueue (runs.sql), answering with what the store does not know of an
-- inserted run: its max_attempts (the pool's default when not given), when
-- it may start and when it was made; the rest of its answer is what the
-- store sent. An existing run (a repeated idempotency key) is named by its
-- pool, tenant and key; the store reads it whole (run_get_many). Returning
-- whole rows was most of a batch's CPU in the API process (each row's
-- columns and JSON parsed, then rendered again), and a sixth of the
-- statement's (`ins` keeps only what is returned and what the CTEs after
-- it read: whole rows there cost another 3 us a run). The id comes as text
-- (the store sent it so), and when the run may start only when that is not
-- at once (when it was made).
WITH {{clock}}, {{enqueue_insert}}
    RETURNING r.id, r.pool, r.tenant_id, r.idempotency_key, r.labels, r.delayed, r.max_attempts,
              r.available_at, r.created_at, (r.xmax = 0) AS inserted
), {{enqueue_after}}
SELECT ins.id::text, ins.inserted, ins.max_attempts, ins.created_at,
       nullif(ins.available_at, ins.created_at) AS available_at,
       CASE WHEN NOT ins.inserted THEN ins.pool END AS pool,
       CASE WHEN NOT ins.inserted THEN ins.tenant_id END AS tenant_id,
       CASE WHEN NOT ins.inserted THEN ins.idempotency_key END AS idempotency_key
  FROM ins CROSS JOIN notify;


-- name: run_get_many
SELECT * FROM agent_runs WHERE id = ANY (%(ids)s::uuid[]);
