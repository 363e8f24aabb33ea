-- Parts shared by statements (db/queries.py fills `{{name}}` in with them).


-- part: lease_held
-- A worker's write to one run (%(id)s) lands only while the run's lease is
-- still the caller's: the fencing triple (locked_by, lease_epoch, 'leased')
-- and locked_until ahead by the database clock, so a write that arrives late
-- never lands on an expired lease (runs.sql's head says why the IS TRUE).
-- It goes in each fenced statement's own WHERE: an UPDATE re-checks it on
-- the newest row version, a locking read (FOR SHARE) likewise.
r.id = %(id)s
       AND r.lease_epoch = %(epoch)s
       AND r.locked_by = %(worker)s
       AND (r.status = 'leased') IS TRUE
       AND r.locked_until > coalesce(%(now)s::timestamptz, now())
