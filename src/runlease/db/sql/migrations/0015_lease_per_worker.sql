-- 0015: a lease belongs to a worker incarnation (issue 26, core v2).
--
-- A run's lease is live while its holder's incarnation (its row of
-- agent_run_workers, locked_by = id) is live: not ended, and unexpired by
-- the database clock. The heartbeat renews that one row, whatever the runs
-- the worker holds; the reaper ends expired incarnations and requeues their
-- runs. So runs no longer carry a lease time of their own: locked_until goes
-- (what the console and the API show as a run's lease expiry is its
-- holder's expires_at), and no heartbeat writes agent_runs any more.

-- ACCESS EXCLUSIVE from the first statement on: no claim, ack or renewal of
-- the old code lands between carrying the leases over and dropping the column.
ALTER TABLE agent_runs DROP CONSTRAINT agent_runs_lease_iff_leased;

-- Ended: the incarnation can never renew again (the reaper sets it when the
-- row expired, a clean shutdown when the worker leaves). Its worker fences
-- every run it held and registers again under a new id.
ALTER TABLE agent_run_workers ADD COLUMN ended_at timestamptz;

-- Every lease is carried over to an incarnation of its own, named after its
-- holder with a suffix: a worker of the old code still running keeps
-- beating its old row by its old id, and that must not keep the carried
-- leases alive (it cannot write to them any more: its statements name the
-- dropped column). Each carried incarnation lives exactly as long as its
-- runs' leases would have; the lapsed ones get one already expired, so the
-- reaper's next pass requeues them as it would have before.
UPDATE agent_runs
   SET locked_by = left(locked_by, 230)
                   || CASE WHEN locked_until > now() THEN ':0015' ELSE ':0015-lapsed' END
 WHERE status = 'leased';

INSERT INTO agent_run_workers AS w
       (id, pool, version, concurrency, runs_held, started_at, heartbeat_at, expires_at)
SELECT r.locked_by, min(r.pool), 'unknown', 0, count(*), now(), now(),
       CASE WHEN r.locked_by LIKE '%:0015-lapsed' THEN least(max(r.locked_until), now())
            ELSE max(r.locked_until) END
  FROM agent_runs r
 WHERE r.status = 'leased'
 GROUP BY r.locked_by
    ON CONFLICT (id) DO UPDATE
   SET expires_at = greatest(w.expires_at, excluded.expires_at),
       runs_held = excluded.runs_held;

ALTER TABLE agent_runs DROP COLUMN locked_until;
-- The old CHECK allowed a holder's name on a run without a lease time; none
-- of our statements left one, but a hand-edited row must not fail the
-- migration.
UPDATE agent_runs SET locked_by = NULL WHERE status <> 'leased' AND locked_by IS NOT NULL;
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_lease_iff_leased
    CHECK ((status = 'leased') = (locked_by IS NOT NULL));

-- The heartbeat tells its worker of cancels it may have missed (a NOTIFY is
-- not durable): the leased runs of one holder whose cancel was requested. A
-- few rows, whatever the runs held; a cancel request writes one entry. Its
-- predicate names no status, and neither does the heartbeat's lookup, so no
-- other index of leased runs (agent_runs_holder_idx: every run of the
-- holder) can serve that lookup: a planner whose statistics are stale (a
-- table analyzed before the burst) once chose that one, reading every lease
-- held. locked_by is set exactly while leased (the CHECK above).
CREATE INDEX agent_runs_cancel_held_idx
    ON agent_runs (locked_by)
    WHERE locked_by IS NOT NULL AND cancel_requested_at IS NOT NULL;

-- The reaper's loose scan of holders and its read of one holder's runs:
-- keyed on locked_by, with a predicate of its own (lease_epoch > 0, always
-- true of a leased run: the CHECK) that only the reaper's statements state.
-- So no other lookup by holder can be read off it: with statistics of a
-- table analyzed before the burst, the heartbeat's cancel lookup read every
-- lease of its worker from it; and the index of leased runs by tenant
-- (agent_runs_leased_idx) plus a sort is never a choice for the reaper
-- (with statistics of a million done runs the planner took it, reading
-- every lease of the fleet per reap).
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_leased_epoch
    CHECK (locked_by IS NULL OR lease_epoch > 0);
DROP INDEX agent_runs_holder_idx;
CREATE INDEX agent_runs_holder_idx
    ON agent_runs (locked_by, id)
    WHERE locked_by IS NOT NULL AND lease_epoch > 0;

-- The pool's fair order (enqueue: where its head is) by the same rule: a
-- predicate of its own (fair_seq >= 0, always true: the CHECK) that only
-- the head lookups state, so a tenant's own line (the claim's places, an
-- enqueue's lane) can never be read off the whole pool's order filtered by
-- tenant, which stale statistics made the planner choose (18,000 rows read
-- per claim of a burst of 20,000 runs of 10 tenants).
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_fair_seq_nonneg CHECK (fair_seq >= 0);
DROP INDEX agent_runs_claim_idx;
CREATE INDEX agent_runs_claim_idx
    ON agent_runs (pool, fair_seq, id)
    WHERE status = 'pending' AND NOT delayed AND fair_seq >= 0;

-- The oldest wait (queue stats) by the same rule: the index of due runs by
-- time gets a predicate of its own (available_at > '-infinity', true of
-- every run: enqueue takes the later of its time and now) that only that
-- lookup states. Without it, stale statistics made the planner read an
-- enqueue's lane end (a tenant's last place) off this index filtered by
-- tenant and sorted: 18,000 rows per lane of a burst of 20,000 runs.
DROP INDEX agent_runs_ready_idx;
CREATE INDEX agent_runs_ready_idx
    ON agent_runs (pool, available_at)
    WHERE status = 'pending' AND NOT delayed AND available_at > '-infinity';
