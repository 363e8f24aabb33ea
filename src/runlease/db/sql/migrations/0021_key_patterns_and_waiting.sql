-- 0021 (issue 27's rest): key limits by pattern, and each key's waiting runs
-- counted as they park and unpark.

-- A pool's key limit may name a pattern: `*` stands for any characters
-- ("user-*", "*-prod", "repo-*-main"). A key takes its own row's limit,
-- else the longest pattern it matches (runlease_key_limit, functions.sql),
-- else the pool's default ('*' alone). Each key matching a pattern is
-- limited on its own: the pattern is not one limit shared by its keys.
ALTER TABLE agent_run_key_limits
    DROP CONSTRAINT agent_run_key_limits_key_bounded,
    ADD CONSTRAINT agent_run_key_limits_key_bounded
        CHECK (key ~ '^[A-Za-z0-9*][A-Za-z0-9._:@*-]{0,127}$');

-- `waiting`: the key's runs parked for a slot, kept by the same statements
-- that park and unpark them (under the key's row lock), so the metrics'
-- top keys by waiting runs read a few index entries, not the parked runs.
ALTER TABLE agent_run_keys
    ADD COLUMN waiting integer NOT NULL DEFAULT 0 CHECK (waiting >= 0);

UPDATE agent_run_keys k
   SET waiting = p.n
  FROM (SELECT r.pool, r.tenant_id, r.concurrency_key, count(*) AS n
          FROM agent_runs r
         WHERE r.key_due_at IS NOT NULL AND r.status = 'pending'
         GROUP BY 1, 2, 3) p
 WHERE k.pool = p.pool AND k.tenant_id = p.tenant_id AND k.key = p.concurrency_key;

-- A pool's keys with waiting runs, the most first (the gauge's top keys).
CREATE INDEX agent_run_keys_waiting_idx
    ON agent_run_keys (pool, waiting DESC)
    WHERE waiting > 0;
