-- 0014: a tenant's finished runs, newest first, for GET /v1/runs?status=done
-- (and cancelled, dead, finished_*). From the tenant's line in
-- agent_run_tenant_index, such a filter first reads every run still pending
-- or leased above its matches: a backlog of 5,000 was 5,000 lookups before
-- the first done run. An entry is added once, when a run finishes (that
-- update already changes status and is not HOT); claims and heartbeats add none.
CREATE INDEX agent_runs_finished_tenant_idx
    ON agent_runs (tenant_id, id)
    WHERE finished_at IS NOT NULL;
