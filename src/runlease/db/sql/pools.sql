-- Pools and their tenant limits (agent_run_pools, agent_run_tenant_limits).


-- name: pool_upsert
INSERT INTO agent_run_pools AS p
       (name, max_attempts, lease_s, default_max_in_flight, priority_aging_s)
VALUES (%(name)s, %(max_attempts)s, %(lease_s)s, %(default_max_in_flight)s, %(priority_aging_s)s)
    ON CONFLICT (name) DO UPDATE
   SET max_attempts = excluded.max_attempts,
       lease_s = excluded.lease_s,
       default_max_in_flight = excluded.default_max_in_flight,
       priority_aging_s = excluded.priority_aging_s,
       updated_at = now()
RETURNING *;


-- name: pool_get
SELECT * FROM agent_run_pools WHERE name = %(name)s;


-- name: pool_list
SELECT * FROM agent_run_pools ORDER BY name;


-- name: tenant_limits_replace
-- Make the pool's overrides exactly the given list: upsert those given,
-- delete the others (an override removed from a spec is removed here).
WITH given AS (
    SELECT * FROM unnest(%(tenants)s::text[], %(limits)s::integer[]) AS g (tenant_id, max_in_flight)
), removed AS (
    DELETE FROM agent_run_tenant_limits t
     WHERE t.pool = %(pool)s
       AND t.tenant_id <> ALL (%(tenants)s::text[])
    RETURNING t.tenant_id
), upserted AS (
    INSERT INTO agent_run_tenant_limits AS t (pool, tenant_id, max_in_flight)
    SELECT %(pool)s, given.tenant_id, given.max_in_flight FROM given
        ON CONFLICT (pool, tenant_id) DO UPDATE
       SET max_in_flight = excluded.max_in_flight, updated_at = now()
     WHERE t.max_in_flight IS DISTINCT FROM excluded.max_in_flight
    RETURNING t.tenant_id
)
SELECT (SELECT count(*) FROM removed) AS removed, (SELECT count(*) FROM upserted) AS upserted;


-- name: tenant_limit_set
INSERT INTO agent_run_tenant_limits AS t (pool, tenant_id, max_in_flight)
VALUES (%(pool)s, %(tenant)s, %(max_in_flight)s)
    ON CONFLICT (pool, tenant_id) DO UPDATE
   SET max_in_flight = excluded.max_in_flight, updated_at = now();


-- name: tenant_limit_delete
DELETE FROM agent_run_tenant_limits WHERE pool = %(pool)s AND tenant_id = %(tenant)s;


-- name: tenant_limits_list
SELECT tenant_id, max_in_flight FROM agent_run_tenant_limits
 WHERE pool = %(pool)s
 ORDER BY tenant_id;
