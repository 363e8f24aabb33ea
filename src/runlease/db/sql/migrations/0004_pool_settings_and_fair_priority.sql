-- 0004: pool settings single-sourced on the pool row (retention_s, paused,
-- tool_env); tenant priority bands; fairness across tenants before priority
-- (the claim's places come from the fair order alone, priority orders a
-- tenant's own runs).
ALTER TABLE agent_run_pools
    ADD COLUMN retention_s integer NOT NULL DEFAULT 604800 CHECK (retention_s >= 0),
    ADD COLUMN paused boolean NOT NULL DEFAULT false,
    ADD COLUMN tool_env text[] NOT NULL DEFAULT '{}'
        CONSTRAINT agent_run_pools_tool_env_check
        CHECK (cardinality(tool_env) <= 64
               AND (cardinality(tool_env) = 0
                    OR array_to_string(tool_env, ' ', ' ')
                       ~ '^[A-Z_][A-Z0-9_]{0,127}( [A-Z_][A-Z0-9_]{0,127})*$'));

ALTER TABLE agent_run_tenant_limits
    ALTER COLUMN max_in_flight DROP NOT NULL,
    ADD COLUMN priority_min integer CHECK (priority_min BETWEEN -100 AND 100),
    ADD COLUMN priority_max integer CHECK (priority_max BETWEEN -100 AND 100),
    ADD CONSTRAINT agent_run_tenant_limits_band_check CHECK (priority_min <= priority_max);

-- Fair_seq was assigned per (tenant, priority) lane; from now on a tenant's
-- runs share one line. Existing pending runs keep their tags: they stay in
-- the order they had within each tenant, and new runs join after them.
DROP INDEX agent_runs_claim_idx;
CREATE INDEX agent_runs_claim_idx
    ON agent_runs (pool, fair_seq, id)
    WHERE status = 'pending';

DROP INDEX agent_runs_pending_tenant_idx;
CREATE INDEX agent_runs_pending_tenant_idx
    ON agent_runs (pool, tenant_id, fair_seq)
    WHERE status = 'pending';

CREATE INDEX agent_runs_pending_priority_idx
    ON agent_runs (pool, tenant_id, priority DESC, fair_seq, id)
    WHERE status = 'pending';

-- The claim for this schema: runlease_claim in ../functions.sql.
