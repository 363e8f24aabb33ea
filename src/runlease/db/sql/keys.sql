-- Concurrency keys (issue 27, migration 0017): a pool limits how many runs
-- of one (tenant, key) hold a slot at once; the others are parked until a
-- slot is handed to them (functions.sql: runlease_key_join, _release, _refill).


-- name: key_join
-- A run just inserted, in the same transaction, joins its key.
SELECT runlease_key_join(%(id)s, %(key)s) AS parked;


-- name: key_limits_get
-- A pool's key limits: '*' is its default per-key limit.
SELECT key, max_in_flight FROM agent_run_key_limits
 WHERE pool = %(pool)s
 ORDER BY key;


-- name: key_limits_replace
-- A pool's key limits become exactly these (a JSON object key -> limit),
-- after key_limits_clear in the same transaction.
INSERT INTO agent_run_key_limits (pool, key, max_in_flight)
SELECT %(pool)s, l.key, l.value::integer
  FROM jsonb_each_text(%(limits)s::jsonb) AS l (key, value);


-- name: key_limits_clear
-- Before key_limits_replace in one transaction: a CTE's DELETE and the
-- INSERT of the same statement cannot see each other's rows.
DELETE FROM agent_run_key_limits WHERE pool = %(pool)s;


-- name: key_refill
-- After a change of a pool's key limits: free slots go to parked runs now.
SELECT runlease_key_refill(%(pool)s, %(batch)s, %(now)s::timestamptz) AS moved;


-- name: key_active
-- How many runs of a tenant's key hold a slot, and how many wait parked:
-- counted (the maintained `waiting`) and read.
SELECT coalesce((SELECT k.active FROM agent_run_keys k
                  WHERE k.pool = %(pool)s AND k.tenant_id = %(tenant)s AND k.key = %(key)s),
                0) AS active,
       coalesce((SELECT k.waiting FROM agent_run_keys k
                  WHERE k.pool = %(pool)s AND k.tenant_id = %(tenant)s AND k.key = %(key)s),
                0) AS waiting,
       (SELECT count(*) FROM agent_runs r
         WHERE r.pool = %(pool)s AND r.tenant_id = %(tenant)s AND r.concurrency_key = %(key)s
           AND r.key_due_at IS NOT NULL AND r.status = 'pending') AS parked;


-- name: key_lock
-- The key's row (made on first use), locked for the transaction: a batch
-- takes its keys' rows first, in one order (db/keyed.py, lock_keyed).
INSERT INTO agent_run_keys AS k (pool, tenant_id, key)
VALUES (%(pool)s, %(tenant)s, %(key)s)
    ON CONFLICT (pool, tenant_id, key) DO UPDATE SET active = k.active
RETURNING k.active;


-- name: keys_waiting_top
-- A pool's keys with the most runs parked for a slot (the per-key waiting
-- gauge: top keys only), from agent_run_keys_waiting_idx: `limit` entries
-- read however many keys or parked runs there are.
SELECT k.tenant_id, k.key, k.waiting, k.active
  FROM agent_run_keys k
 WHERE k.pool = %(pool)s AND k.waiting > 0
 ORDER BY k.waiting DESC
 LIMIT %(limit)s;
