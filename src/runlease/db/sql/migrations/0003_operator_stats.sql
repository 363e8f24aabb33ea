-- 0003: let the operator count recent lease expiries per pool cheaply.
CREATE INDEX agent_run_events_lease_expired_idx
    ON agent_run_events (created_at)
    WHERE kind = 'run.lease_expired';
