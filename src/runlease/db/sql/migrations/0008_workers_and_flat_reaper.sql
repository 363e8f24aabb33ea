-- 0008: the workers registry, a reaper and retention flat in live leases,
-- and maintained queue counts (issue 16). See schema.sql for why each piece
-- is there.

-- No write may slip between the first count and the counting triggers.
LOCK TABLE agent_runs IN SHARE ROW EXCLUSIVE MODE;
CREATE INDEX agent_runs_holder_idx
    ON agent_runs (locked_by, id)
    WHERE status = 'leased';

CREATE INDEX agent_runs_finished_idx
    ON agent_runs (pool, finished_at)
    WHERE finished_at IS NOT NULL;

-- Queue stats: the oldest ready run's wait (one descent), not a scan of the
-- pool's pending runs. available_at changes only on transitions that are not
-- HOT anyway.
CREATE INDEX agent_runs_ready_idx
    ON agent_runs (pool, available_at)
    WHERE status = 'pending' AND NOT delayed;

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

-- Queue counts kept as they change (runlease.db.stats): the operator's
-- autoscaler and the console read them every few seconds, and counting a
-- million pending runs each time cost a scan of them all. Only the states
-- that can grow without bound are counted: pending (ready), delayed (pending
-- in backoff) and dead (by error code); leased runs are counted from
-- agent_runs_leased_idx (bounded by what is in flight). A change appends a
-- delta row (insert-only: no row every writer updates); the reaper's leader
-- folds the deltas into agent_run_counts every pass; a read sums both.
CREATE TABLE agent_run_counts (
    pool       text   NOT NULL,
    tenant_id  text   NOT NULL,
    state      text   NOT NULL CHECK (state IN ('pending', 'delayed', 'dead')),
    -- '' unless dead.
    error_code text   NOT NULL DEFAULT '',
    n          bigint NOT NULL,
    PRIMARY KEY (pool, tenant_id, state, error_code)
);

CREATE TABLE agent_run_count_deltas (
    pool       text   NOT NULL,
    tenant_id  text   NOT NULL,
    state      text   NOT NULL,
    error_code text   NOT NULL DEFAULT '',
    n          bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- The counted state of a run ('' when it is in none: leased, done, cancelled).
CREATE FUNCTION runlease_counted_state(p_status text, p_delayed boolean) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN p_status = 'pending' AND p_delayed THEN 'delayed'
            WHEN p_status IN ('pending', 'dead') THEN p_status
            ELSE '' END;

-- Inserts and deletes: one statement-level trigger each, one delta row per
-- (pool, tenant, state) of the statement (a batch enqueue of 1,000 runs
-- appends one row). Updates: a row-level trigger whose WHEN passes only a
-- change of counted state, so heartbeats, acks and cancels of leased runs
-- (most updates) fire nothing.
CREATE FUNCTION runlease_count_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO agent_run_count_deltas (pool, tenant_id, state, error_code, n)
        SELECT r.pool, r.tenant_id, runlease_counted_state(r.status, r.delayed),
               CASE WHEN r.status = 'dead' THEN coalesce(r.error_code, '') ELSE '' END,
               count(*)
          FROM new_rows r
         WHERE runlease_counted_state(r.status, r.delayed) <> ''
         GROUP BY 1, 2, 3, 4;
    ELSE
        INSERT INTO agent_run_count_deltas (pool, tenant_id, state, error_code, n)
        SELECT r.pool, r.tenant_id, runlease_counted_state(r.status, r.delayed),
               CASE WHEN r.status = 'dead' THEN coalesce(r.error_code, '') ELSE '' END,
               -count(*)
          FROM old_rows r
         WHERE runlease_counted_state(r.status, r.delayed) <> ''
         GROUP BY 1, 2, 3, 4;
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION runlease_count_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_old text := runlease_counted_state(OLD.status, OLD.delayed);
    v_new text := runlease_counted_state(NEW.status, NEW.delayed);
BEGIN
    INSERT INTO agent_run_count_deltas (pool, tenant_id, state, error_code, n)
    SELECT d.pool, d.tenant_id, d.state, d.error_code, d.n
      FROM (VALUES (OLD.pool, OLD.tenant_id, v_old,
                    CASE WHEN v_old = 'dead' THEN coalesce(OLD.error_code, '') ELSE '' END,
                    -1::bigint),
                   (NEW.pool, NEW.tenant_id, v_new,
                    CASE WHEN v_new = 'dead' THEN coalesce(NEW.error_code, '') ELSE '' END,
                    1::bigint)) AS d (pool, tenant_id, state, error_code, n)
     WHERE d.state <> '';
    RETURN NULL;
END;
$$;

CREATE TRIGGER agent_runs_count_insert AFTER INSERT ON agent_runs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION runlease_count_rows();

CREATE TRIGGER agent_runs_count_delete AFTER DELETE ON agent_runs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION runlease_count_rows();

CREATE TRIGGER agent_runs_count_update AFTER UPDATE ON agent_runs
    FOR EACH ROW
    WHEN (runlease_counted_state(OLD.status, OLD.delayed)
              IS DISTINCT FROM runlease_counted_state(NEW.status, NEW.delayed)
          OR (NEW.status = 'dead' AND OLD.error_code IS DISTINCT FROM NEW.error_code)
          OR OLD.pool IS DISTINCT FROM NEW.pool
          OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id)
    EXECUTE FUNCTION runlease_count_change();

INSERT INTO agent_run_counts (pool, tenant_id, state, error_code, n)
SELECT r.pool, r.tenant_id, runlease_counted_state(r.status, r.delayed),
       CASE WHEN r.status = 'dead' THEN coalesce(r.error_code, '') ELSE '' END, count(*)
  FROM agent_runs r
 WHERE runlease_counted_state(r.status, r.delayed) <> ''
 GROUP BY 1, 2, 3, 4;
