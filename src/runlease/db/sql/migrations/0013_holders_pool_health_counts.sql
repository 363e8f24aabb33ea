-- 0013: who held each lease (agent_runs.holders, appended by the claim),
-- lease health per pool and minute (agent_run_pool_health: expiries from the
-- reap, stale writes from the workers' registry rows), and cancelled and
-- total runs in the maintained counts (done runs are the total less the rest).
-- The claim's append and the counting triggers are in ../functions.sql,
-- applied in this same transaction, under this lock: no write falls between
-- the first count below and the triggers that keep it.
LOCK TABLE agent_runs IN SHARE ROW EXCLUSIVE MODE;

-- Who held each lease: the claim appends {worker, attempt, at, seq} (seq: the
-- run's event_seq then, so the event that ended the attempt is the first
-- attempt-ending run.* event after it), the last 16 only. Written by the
-- claim's own UPDATE (no statement added), never indexed.
ALTER TABLE agent_runs ADD COLUMN holders jsonb NOT NULL DEFAULT '[]'::jsonb;

-- Fenced writes of this worker that matched no row (its lease was gone), as
-- its heartbeats reported them, not yet moved into agent_run_pool_health by
-- the reaper's leader. Not indexed: renewals stay HOT.
ALTER TABLE agent_run_workers
    ADD COLUMN stale_writes bigint NOT NULL DEFAULT 0 CHECK (stale_writes >= 0);

-- The console's last hour per pool, by the minute: lease expiries (counted
-- by the reap statement) and stale writes (folded in from the registry rows);
-- minutes older than a day are deleted by the reaper's leader.
CREATE TABLE agent_run_pool_health (
    pool           text        NOT NULL,
    minute         timestamptz NOT NULL,
    lease_expiries bigint      NOT NULL DEFAULT 0,
    stale_writes   bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (pool, minute)
);

-- Cancelled runs, and every run as 'total' (by the insert and delete
-- triggers only): done runs are the total less the rest.
ALTER TABLE agent_run_counts DROP CONSTRAINT agent_run_counts_state_check;
ALTER TABLE agent_run_counts ADD CONSTRAINT agent_run_counts_state_check
    CHECK (state IN ('pending', 'delayed', 'dead', 'cancelled', 'total'));

-- A tenant's counts in every pool (the console's runs page, polled): the key
-- leads with the pool. Only the leader's fold writes this table.
CREATE INDEX agent_run_counts_tenant_idx ON agent_run_counts (tenant_id);

-- The runs already there (the counted state spelled out: a migration calls no function).
INSERT INTO agent_run_counts (pool, tenant_id, state, error_code, n)
SELECT r.pool, r.tenant_id, s.state, '', count(*)
  FROM agent_runs r
 CROSS JOIN LATERAL (VALUES (CASE WHEN r.status = 'cancelled' THEN 'cancelled' ELSE '' END),
                            ('total')) AS s (state)
 WHERE s.state <> ''
 GROUP BY 1, 2, 3;
