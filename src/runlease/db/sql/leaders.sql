-- Leader election through the queue's own database (runlease_leaders).
-- One row per role ("reaper"): its holder, a term that grows at every
-- change of holder, and an expiry. Whoever finds the row expired takes it.


-- name: leader_acquire
INSERT INTO runlease_leaders AS l (name, leader_id, term, elected_at, expires_at)
VALUES (%(name)s, %(me)s, 1, coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl_s)s))
    ON CONFLICT (name) DO UPDATE
   SET leader_id = excluded.leader_id, term = l.term + 1,
       elected_at = excluded.elected_at, expires_at = excluded.expires_at
 WHERE l.expires_at < coalesce(%(now)s::timestamptz, now())
RETURNING l.term;


-- name: leader_renew
UPDATE runlease_leaders
   SET expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl_s)s)
 WHERE name = %(name)s AND leader_id = %(me)s AND term = %(term)s
   AND expires_at >= coalesce(%(now)s::timestamptz, now())
RETURNING term;


-- name: leader_resign
-- Step down at once, so a successor need not wait for the expiry.
UPDATE runlease_leaders
   SET expires_at = coalesce(%(now)s::timestamptz, now()) - interval '1 microsecond'
 WHERE name = %(name)s AND leader_id = %(me)s AND term = %(term)s;

