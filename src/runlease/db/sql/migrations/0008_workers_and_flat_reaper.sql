-- 0008: the workers registry, a reaper and retention flat in live leases,
-- and maintained queue counts (issue 16). docs/schema.md says why each piece
-- is there.

-- No write may slip between the first count and the counting triggers.
LOCK TABLE agent_runs IN SHARE ROW EXCLUSIVE MODE;
CREATE INDEX agent_runs_holder_idx
    ON agent_runs (locked_by, id)
    WHERE status = 'leased';

CREATE INDEX agent_runs_finished_idx
    ON agent_runs (pool, finished_at)
    WHERE finished_at IS NOT NULL;

-- Queue stats: the oldest ready run's wait (one descent), not a scan of the
-- pool's pending runs. available_at changes only on transitions that are not
-- HOT anyway.
CREATE INDEX agent_runs_ready_idx
    ON agent_runs (pool, available_at)
    WHERE status = 'pending' AND NOT delayed;

CREATE TABLE agent_run_workers (
    id           text        PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 255),
    pool         text        NOT NULL CHECK (length(pool) BETWEEN 1 AND 48),
    version      text        NOT NULL CHECK (length(version) BETWEEN 1 AND 64),
    concurrency  integer     NOT NULL CHECK (concurrency >= 0),
    runs_held    integer     NOT NULL DEFAULT 0 CHECK (runs_held >= 0),
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
) WITH (fillfactor = 50);

-- Queue counts kept as they change (runlease.db.stats): the operator's
-- autoscaler and the console read them every few seconds, and counting a
-- million pending runs each time cost a scan of them all. Only the states
-- that can grow without bound are counted: pending (ready), delayed (pending
-- in backoff) and dead (by error code); leased runs are counted from
-- agent_runs_leased_idx (bounded by what is in flight). A change appends a
-- delta row (insert-only: no row every writer updates); the reaper's leader
-- folds the deltas into agent_run_counts every pass; a read sums both.
CREATE TABLE agent_run_counts (
    pool       text   NOT NULL,
    tenant_id  text   NOT NULL,
    state      text   NOT NULL CHECK (state IN ('pending', 'delayed', 'dead')),
    -- '' unless dead.
    error_code text   NOT NULL DEFAULT '',
    n          bigint NOT NULL,
    PRIMARY KEY (pool, tenant_id, state, error_code)
);

CREATE TABLE agent_run_count_deltas (
    pool       text   NOT NULL,
    tenant_id  text   NOT NULL,
    state      text   NOT NULL,
    error_code text   NOT NULL DEFAULT '',
    n          bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- The counting triggers are in ../functions.sql, which migrate applies in
-- this same transaction, under the lock above. The first count (the counted
-- state spelled out: runlease_counted_state is created there too):
INSERT INTO agent_run_counts (pool, tenant_id, state, error_code, n)
SELECT r.pool, r.tenant_id,
       CASE WHEN r.status = 'pending' AND r.delayed THEN 'delayed' ELSE r.status END,
       CASE WHEN r.status = 'dead' THEN coalesce(r.error_code, '') ELSE '' END, count(*)
  FROM agent_runs r
 WHERE r.status IN ('pending', 'dead')
 GROUP BY 1, 2, 3, 4;
