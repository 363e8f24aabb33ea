-- 0005: a pool row records the AgentRunPool (namespace/name) that owns it, so
-- a pool of the same name in another namespace is refused, not merged.
ALTER TABLE agent_run_pools
    ADD COLUMN owner text CHECK (length(owner) BETWEEN 3 AND 317);
