-- 0009: labels on runs, and the side table that finds runs by label.
-- The column is added with a constant default: no table rewrite.
ALTER TABLE agent_runs ADD COLUMN labels jsonb NOT NULL DEFAULT '{}'::jsonb;

-- A run's labels, one row each, written once at enqueue (labels never
-- change): finding a tenant's runs by label is one range scan, newest first,
-- instead of an index on agent_runs that every claim and ack would update.
CREATE TABLE agent_run_labels (
    tenant_id text NOT NULL,
    key       text NOT NULL,
    value     text NOT NULL,
    run_id    uuid NOT NULL,
    PRIMARY KEY (tenant_id, key, value, run_id)
);

-- Admins search a label across tenants.
CREATE INDEX agent_run_labels_any_tenant_idx ON agent_run_labels (key, value, run_id);
