-- 0008: the workers registry, and a reaper and retention flat in live leases
-- (issue 16). See schema.sql for why each piece is there.
CREATE INDEX agent_runs_holder_idx
    ON agent_runs (locked_by, id)
    WHERE status = 'leased';

CREATE INDEX agent_runs_finished_idx
    ON agent_runs (pool, finished_at)
    WHERE finished_at IS NOT NULL;

CREATE TABLE agent_run_workers (
    id           text        PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 255),
    pool         text        NOT NULL CHECK (length(pool) BETWEEN 1 AND 48),
    version      text        NOT NULL CHECK (length(version) BETWEEN 1 AND 64),
    concurrency  integer     NOT NULL CHECK (concurrency >= 0),
    runs_held    integer     NOT NULL DEFAULT 0 CHECK (runs_held >= 0),
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
) WITH (fillfactor = 50);
