-- Pools and their tenant settings (agent_run_pools, agent_run_tenant_limits).


-- name: pool_upsert
-- Every setting of the pool, as given: the store's put/patch callers decide
-- what is given (the CLI reads the pool first and changes only what it is told).
INSERT INTO agent_run_pools AS p
       (name, max_attempts, lease_s, default_max_in_flight, priority_aging_s, retention_s,
        paused, tool_env)
VALUES (%(name)s, %(max_attempts)s, %(lease_s)s, %(default_max_in_flight)s,
        %(priority_aging_s)s, %(retention_s)s, %(paused)s, %(tool_env)s::text[])
    ON CONFLICT (name) DO UPDATE
   SET max_attempts = excluded.max_attempts,
       lease_s = excluded.lease_s,
       default_max_in_flight = excluded.default_max_in_flight,
       priority_aging_s = excluded.priority_aging_s,
       retention_s = excluded.retention_s,
       paused = excluded.paused,
       tool_env = excluded.tool_env,
       updated_at = now()
RETURNING *;


-- name: pool_get
SELECT * FROM agent_run_pools WHERE name = %(name)s;


-- name: pool_list
SELECT * FROM agent_run_pools ORDER BY name;


-- name: tenant_limits_replace
-- Make the pool's tenant settings exactly the given list: upsert those given,
-- delete the others (an override removed from a spec is removed here).
WITH given AS (
    SELECT * FROM unnest(%(tenants)s::text[], %(limits)s::integer[], %(mins)s::integer[],
                         %(maxs)s::integer[], %(submits)s::integer[], %(tokens)s::bigint[])
           AS g (tenant_id, max_in_flight, priority_min, priority_max, submits_per_minute,
                 tokens_per_minute)
), removed AS (
    DELETE FROM agent_run_tenant_limits t
     WHERE t.pool = %(pool)s
       AND t.tenant_id <> ALL (%(tenants)s::text[])
    RETURNING t.tenant_id
), upserted AS (
    INSERT INTO agent_run_tenant_limits AS t
           (pool, tenant_id, max_in_flight, priority_min, priority_max, submits_per_minute,
            tokens_per_minute)
    SELECT %(pool)s, given.tenant_id, given.max_in_flight, given.priority_min,
           given.priority_max, given.submits_per_minute, given.tokens_per_minute
      FROM given
        ON CONFLICT (pool, tenant_id) DO UPDATE
       SET max_in_flight = excluded.max_in_flight, priority_min = excluded.priority_min,
           priority_max = excluded.priority_max,
           submits_per_minute = excluded.submits_per_minute,
           tokens_per_minute = excluded.tokens_per_minute, updated_at = now()
     WHERE (t.max_in_flight, t.priority_min, t.priority_max, t.submits_per_minute,
            t.tokens_per_minute)
           IS DISTINCT FROM (excluded.max_in_flight, excluded.priority_min,
                             excluded.priority_max, excluded.submits_per_minute,
                             excluded.tokens_per_minute)
    RETURNING t.tenant_id
)
SELECT (SELECT count(*) FROM removed) AS removed, (SELECT count(*) FROM upserted) AS upserted;


-- name: tenant_limit_set
-- One tenant's cap; its priority band is kept. NULL: the pool's default.
INSERT INTO agent_run_tenant_limits AS t (pool, tenant_id, max_in_flight)
VALUES (%(pool)s, %(tenant)s, %(max_in_flight)s)
    ON CONFLICT (pool, tenant_id) DO UPDATE
   SET max_in_flight = excluded.max_in_flight, updated_at = now();


-- name: tenant_band_set
-- One tenant's priority band; its cap is kept. NULL, NULL: no band.
INSERT INTO agent_run_tenant_limits AS t (pool, tenant_id, priority_min, priority_max)
VALUES (%(pool)s, %(tenant)s, %(priority_min)s, %(priority_max)s)
    ON CONFLICT (pool, tenant_id) DO UPDATE
   SET priority_min = excluded.priority_min, priority_max = excluded.priority_max,
       updated_at = now();


-- name: tenant_limit_prune
-- A row that no longer says anything is removed.
DELETE FROM agent_run_tenant_limits
 WHERE pool = %(pool)s AND tenant_id = %(tenant)s
   AND max_in_flight IS NULL AND priority_min IS NULL AND priority_max IS NULL
   AND submits_per_minute IS NULL AND tokens_per_minute IS NULL AND max_pending IS NULL;


-- name: tenant_limits_list
SELECT tenant_id, max_in_flight, priority_min, priority_max, submits_per_minute,
       tokens_per_minute
  FROM agent_run_tenant_limits
 WHERE pool = %(pool)s
 ORDER BY tenant_id;


-- name: tenant_band_get
SELECT priority_min, priority_max FROM agent_run_tenant_limits
 WHERE pool = %(pool)s AND tenant_id = %(tenant)s;


-- name: pool_owner_claim
-- The pool's owner after this: `owner` if the pool had none (a new row, with
-- defaults the caller then overwrites) or was already its; else the owner it
-- has. The row lock of ON CONFLICT makes two claimants take turns.
INSERT INTO agent_run_pools AS p (name, owner)
VALUES (%(name)s, %(owner)s)
    ON CONFLICT (name) DO UPDATE
   SET owner = coalesce(p.owner, excluded.owner)
RETURNING owner;


-- name: pool_owner_get
SELECT owner FROM agent_run_pools WHERE name = %(name)s;


-- name: pool_owner_release
UPDATE agent_run_pools SET owner = NULL WHERE name = %(name)s AND owner = %(owner)s;


-- name: tenant_rate_set
-- One tenant's rates; its cap and band are kept. NULL: no such rate.
INSERT INTO agent_run_tenant_limits AS t (pool, tenant_id, submits_per_minute,
                                          tokens_per_minute)
VALUES (%(pool)s, %(tenant)s, %(submits_per_minute)s, %(tokens_per_minute)s)
    ON CONFLICT (pool, tenant_id) DO UPDATE
   SET submits_per_minute = excluded.submits_per_minute,
       tokens_per_minute = excluded.tokens_per_minute, updated_at = now();


-- name: tenant_quotas_replace
-- The pool's tenants' quotas of waiting runs become exactly those given
-- (the rest of each row kept; a tenant not given: the pool's default).
WITH given AS (
    SELECT * FROM unnest(%(tenants)s::text[], %(quotas)s::integer[]) AS g (tenant_id, quota)
), cleared AS (
    UPDATE agent_run_tenant_limits t SET max_pending = NULL, updated_at = now()
     WHERE t.pool = %(pool)s AND t.max_pending IS NOT NULL
       AND t.tenant_id <> ALL (%(tenants)s::text[])
)
INSERT INTO agent_run_tenant_limits AS t (pool, tenant_id, max_pending)
SELECT %(pool)s, g.tenant_id, g.quota FROM given g
    ON CONFLICT (pool, tenant_id) DO UPDATE
   SET max_pending = excluded.max_pending, updated_at = now();


-- name: tenant_limits_prune_all
-- The pool's rows that no longer say anything are removed.
DELETE FROM agent_run_tenant_limits
 WHERE pool = %(pool)s
   AND max_in_flight IS NULL AND priority_min IS NULL AND priority_max IS NULL
   AND submits_per_minute IS NULL AND tokens_per_minute IS NULL AND max_pending IS NULL;


-- name: pool_quota_set
-- The pool's default quota of waiting runs per tenant (NULL: none).
UPDATE agent_run_pools SET default_max_pending = %(max_pending)s, updated_at = now()
 WHERE name = %(pool)s
RETURNING name;


-- name: queue_quotas_get
SELECT p.default_max_pending,
       coalesce((SELECT jsonb_object_agg(t.tenant_id, t.max_pending)
                   FROM agent_run_tenant_limits t
                  WHERE t.pool = p.name AND t.max_pending IS NOT NULL), '{}') AS tenants
  FROM agent_run_pools p
 WHERE p.name = %(pool)s;
