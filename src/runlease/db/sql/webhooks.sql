-- Completion webhooks: allowed hosts, tenants' signing keys, deliveries.


-- name: webhook_hosts_list
SELECT pattern, allow_private, ports FROM runlease_webhook_hosts ORDER BY pattern;


-- name: webhook_hosts_replace
-- The allowlist becomes exactly the given hosts.
-- (ports: each host's as a comma-separated text, unnest taking no ragged arrays)
WITH given AS (
    SELECT g.pattern, g.allow_private,
           coalesce(string_to_array(nullif(g.ports, ''), ',')::integer[], '{}') AS ports
      FROM unnest(%(patterns)s::text[], %(private)s::boolean[], %(ports)s::text[])
           AS g (pattern, allow_private, ports)
), removed AS (
    DELETE FROM runlease_webhook_hosts h WHERE h.pattern <> ALL (%(patterns)s::text[])
)
INSERT INTO runlease_webhook_hosts AS h (pattern, allow_private, ports)
SELECT pattern, allow_private, ports FROM given
    ON CONFLICT (pattern) DO UPDATE
        SET allow_private = excluded.allow_private, ports = excluded.ports;


-- name: webhook_secret_ensure
-- The tenant's signing key, made on first use (the given one is kept only
-- when the tenant has none).
INSERT INTO agent_webhook_secrets AS s (tenant_id, secret)
VALUES (%(tenant)s, %(secret)s)
    ON CONFLICT (tenant_id) DO UPDATE SET tenant_id = s.tenant_id
RETURNING secret;


-- name: webhook_secret_rotate
INSERT INTO agent_webhook_secrets AS s (tenant_id, secret)
VALUES (%(tenant)s, %(secret)s)
    ON CONFLICT (tenant_id) DO UPDATE SET secret = excluded.secret, created_at = now()
RETURNING secret;


-- name: webhook_add
INSERT INTO agent_run_webhooks (run_id, tenant_id, url)
VALUES (%(id)s, %(tenant)s, %(url)s)
    ON CONFLICT (run_id) DO NOTHING;


-- name: webhook_get
SELECT w.run_id, w.url, w.state, w.tries, w.next_at, w.delivered_at, w.attempts
  FROM agent_run_webhooks w
 WHERE w.run_id = %(id)s
   AND (%(tenant)s::text IS NULL OR w.tenant_id = %(tenant)s::text);


-- name: webhook_take_due
-- Deliveries due whose run has finished, a bounded batch, each put out of
-- reach for lease_s (so no row lock is held during the POST, and a leader
-- that dies mid-delivery only delays it). A tenant gets at most per_tenant
-- deliveries in flight: `tenants`/`busy` are those it has already, the
-- tenants at the bound (`full`) are not even read.
WITH {{clock}}, candidates AS (
    SELECT w.run_id, w.tenant_id, w.next_at
      FROM agent_run_webhooks w
      JOIN agent_runs r ON r.id = w.run_id, clock
     WHERE w.state = 'waiting' AND w.next_at <= clock.ts
       AND r.status IN ('done', 'dead', 'cancelled')
       AND w.tenant_id <> ALL (%(full)s::text[])
     ORDER BY w.next_at
     LIMIT %(scan)s
       FOR UPDATE OF w SKIP LOCKED
), ranked AS (
    SELECT c.run_id, c.next_at, coalesce(b.busy, 0) AS busy,
           row_number() OVER (PARTITION BY c.tenant_id ORDER BY c.next_at, c.run_id) AS n
      FROM candidates c
      LEFT JOIN unnest(%(tenants)s::text[], %(busy)s::integer[]) AS b (tenant_id, busy)
             ON b.tenant_id = c.tenant_id
), due AS (
    SELECT run_id FROM ranked
     WHERE n + busy <= %(per_tenant)s
     ORDER BY next_at
     LIMIT %(batch)s
)
UPDATE agent_run_webhooks w
   SET next_at = clock.ts + make_interval(secs => %(lease_s)s::integer), tries = w.tries + 1
  FROM due, clock, agent_runs r
 WHERE w.run_id = due.run_id AND r.id = w.run_id
RETURNING w.run_id, w.tenant_id, w.url, w.tries, r.status, r.pool, r.error_code,
          r.finished_at,
          (SELECT s.secret FROM agent_webhook_secrets s WHERE s.tenant_id = w.tenant_id)
              AS secret;


-- name: webhook_record
-- One attempt's outcome: delivered, or retried after `retry_s`, or failed
-- for good; the attempt joins the last 20 shown on the run.
UPDATE agent_run_webhooks w
   SET state = %(state)s,
       delivered_at = CASE WHEN %(state)s = 'delivered'
                           THEN coalesce(%(now)s::timestamptz, now()) END,
       next_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(retry_s)s),
       attempts = (SELECT coalesce(jsonb_agg(a.value ORDER BY a.ord), '[]'::jsonb)
                     FROM jsonb_array_elements(w.attempts || jsonb_build_array(%(attempt)s::jsonb))
                          WITH ORDINALITY AS a (value, ord)
                    WHERE a.ord > jsonb_array_length(w.attempts) + 1 - 20)
 WHERE w.run_id = %(id)s AND w.tries = %(tries)s;
