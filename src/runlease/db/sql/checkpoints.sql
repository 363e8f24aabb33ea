-- LangGraph checkpoints (agent_run_graph_checkpoints, agent_run_graph_writes;
-- migration 0022), written by the run that holds the lease.


-- name: graph_checkpoint_put
-- Store a checkpoint, fenced by the lease like a step (FOR SHARE: a reap or
-- re-claim that commits first is seen, one that comes later waits for us);
-- the tenant is the run's. The run keeps its newest %(keep)s checkpoints of
-- this thread and namespace: older ones go, with their writes, in the same
-- statement (the CTEs see the table before the insert, so `old` is what is
-- beyond the newest keep - 1 that were there). No row: the lease is gone.
WITH fence AS (
    SELECT r.id, r.tenant_id, r.lease_epoch
      FROM agent_runs r
     WHERE {{lease_held}}
       FOR SHARE
), ins AS (
    INSERT INTO agent_run_graph_checkpoints AS c
           (tenant_id, thread_key, checkpoint_ns, checkpoint_id, parent_id, run_id,
            lease_epoch, type, checkpoint, metadata, created_at)
    SELECT fence.tenant_id, %(thread)s, %(ns)s, %(checkpoint_id)s, %(parent_id)s, fence.id,
           fence.lease_epoch, %(type)s, %(checkpoint)s, %(metadata)s::jsonb,
           coalesce(%(now)s::timestamptz, now())
      FROM fence
        ON CONFLICT (tenant_id, thread_key, checkpoint_ns, checkpoint_id) DO UPDATE
       SET type = excluded.type, checkpoint = excluded.checkpoint,
           metadata = excluded.metadata, lease_epoch = excluded.lease_epoch
     WHERE c.run_id = excluded.run_id
    RETURNING 1
), old AS (
    SELECT c.tenant_id, c.checkpoint_id
      FROM agent_run_graph_checkpoints c, fence
     WHERE c.run_id = fence.id AND c.thread_key = %(thread)s AND c.checkpoint_ns = %(ns)s
       AND c.checkpoint_id <> %(checkpoint_id)s
     ORDER BY c.checkpoint_id DESC
    OFFSET (%(keep)s - 1)
), pruned AS (
    DELETE FROM agent_run_graph_checkpoints c USING old
     WHERE c.tenant_id = old.tenant_id AND c.thread_key = %(thread)s
       AND c.checkpoint_ns = %(ns)s AND c.checkpoint_id = old.checkpoint_id
), pruned_writes AS (
    DELETE FROM agent_run_graph_writes w USING old
     WHERE w.tenant_id = old.tenant_id AND w.thread_key = %(thread)s
       AND w.checkpoint_ns = %(ns)s AND w.checkpoint_id = old.checkpoint_id
)
SELECT fence.id FROM fence;


-- name: graph_writes_put
-- Store a task's writes against a checkpoint, fenced as above. A regular
-- write (idx >= 0) stored before stays (a task's writes are final); the
-- special ones (an error, an interrupt, a resume: idx < 0) are replaced.
WITH fence AS (
    SELECT r.id, r.tenant_id, r.lease_epoch
      FROM agent_runs r
     WHERE {{lease_held}}
       FOR SHARE
), ins AS (
    INSERT INTO agent_run_graph_writes AS w
           (tenant_id, thread_key, checkpoint_ns, checkpoint_id, task_id, idx, channel,
            type, value, task_path, run_id, lease_epoch)
    SELECT fence.tenant_id, %(thread)s, %(ns)s, %(checkpoint_id)s, %(task_id)s, x.idx,
           x.channel, x.type, x.value, %(task_path)s, fence.id, fence.lease_epoch
      FROM fence,
           unnest(%(idxs)s::integer[], %(channels)s::text[], %(types)s::text[],
                  %(values)s::bytea[]) AS x (idx, channel, type, value)
        ON CONFLICT (tenant_id, thread_key, checkpoint_ns, checkpoint_id, task_id, idx)
        DO UPDATE SET channel = excluded.channel, type = excluded.type,
                      value = excluded.value, task_path = excluded.task_path,
                      run_id = excluded.run_id, lease_epoch = excluded.lease_epoch
     WHERE w.idx < 0
    RETURNING 1
)
SELECT fence.id FROM fence;


-- name: graph_checkpoint_get
-- One checkpoint of a tenant's thread and namespace: the one named, or the
-- newest (checkpoint ids grow with time).
SELECT c.checkpoint_id, c.parent_id, c.type, c.checkpoint, c.metadata, c.run_id
  FROM agent_run_graph_checkpoints c
 WHERE c.tenant_id = %(tenant)s AND c.thread_key = %(thread)s AND c.checkpoint_ns = %(ns)s
   AND (%(checkpoint_id)s::text IS NULL OR c.checkpoint_id = %(checkpoint_id)s::text)
 ORDER BY c.checkpoint_id DESC
 LIMIT 1;


-- name: graph_writes_get
-- The writes stored against one checkpoint, in the order a step applies them
-- (writes_sort_key: task_path, task_id, idx).
SELECT w.task_id, w.channel, w.type, w.value
  FROM agent_run_graph_writes w
 WHERE w.tenant_id = %(tenant)s AND w.thread_key = %(thread)s AND w.checkpoint_ns = %(ns)s
   AND w.checkpoint_id = %(checkpoint_id)s
 ORDER BY w.task_path, w.task_id, w.idx
 LIMIT %(limit)s;


-- name: graph_checkpoint_list
-- A tenant's thread's checkpoints, newest first: of one namespace or all,
-- before a checkpoint id, whose metadata contains %(filter)s.
SELECT c.checkpoint_ns, c.checkpoint_id, c.parent_id, c.type, c.checkpoint, c.metadata,
       c.run_id
  FROM agent_run_graph_checkpoints c
 WHERE c.tenant_id = %(tenant)s AND c.thread_key = %(thread)s
   AND (%(ns)s::text IS NULL OR c.checkpoint_ns = %(ns)s::text)
   AND (%(before)s::text IS NULL OR c.checkpoint_id < %(before)s::text)
   AND (%(checkpoint_id)s::text IS NULL OR c.checkpoint_id = %(checkpoint_id)s::text)
   AND (%(filter)s::jsonb IS NULL OR c.metadata @> %(filter)s::jsonb)
 ORDER BY c.checkpoint_id DESC
 LIMIT %(limit)s;
