-- 0006: costs flat in what waits (issue 16). Runs in backoff leave the
-- claim's indexes (delayed); the claim's places are merged from each
-- claimable tenant's line instead of read off one scan of the pool's fair
-- order, so capped tenants' backlogs and delayed runs are not read per claim.
ALTER TABLE agent_runs ADD COLUMN delayed boolean NOT NULL DEFAULT false;

UPDATE agent_runs SET delayed = true WHERE status = 'pending' AND available_at > now();

DROP INDEX agent_runs_claim_idx;
CREATE INDEX agent_runs_claim_idx
    ON agent_runs (pool, fair_seq, id)
    WHERE status = 'pending' AND NOT delayed;

DROP INDEX agent_runs_pending_tenant_idx;
CREATE INDEX agent_runs_pending_tenant_idx
    ON agent_runs (pool, tenant_id, fair_seq, id)
    WHERE status = 'pending' AND NOT delayed;

DROP INDEX agent_runs_pending_priority_idx;
CREATE INDEX agent_runs_pending_priority_idx
    ON agent_runs (pool, tenant_id, priority DESC, fair_seq, id)
    WHERE status = 'pending' AND NOT delayed;

CREATE INDEX agent_runs_delayed_idx
    ON agent_runs (pool, available_at)
    WHERE status = 'pending' AND delayed;

-- The claim for this schema: runlease_claim in ../functions.sql.
