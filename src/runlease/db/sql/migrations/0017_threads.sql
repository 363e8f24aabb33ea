-- 0017: threads (issue 27). A run may name a thread (tenant-scoped): at most
-- one run of a thread is active at any instant, the others wait in submit
-- order (ARCHITECTURE invariant 11).
--
-- A thread's runs are out of the claim's indexes except its head: a run
-- submitted to a thread that already has an unfinished run is parked, as a
-- parent waiting for its children is (delayed, available_at far ahead, so
-- neither the claim's places nor its promotion ever read it), with the time
-- it was due kept in thread_due_at. When the head finishes (done, dead,
-- cancelled), a trigger (functions.sql, runlease_thread_advance) makes the
-- next parked run, by thread_seq, the head and due. So the claim's cost does
-- not grow with a thread's backlog: a busy thread's waiting runs are never
-- read by a claim.

-- The thread row serializes a thread's submits and finishes (its row lock):
-- next_seq numbers its runs in submit order; head_run_id is the one run of
-- the thread that may be claimed or is active (NULL: the thread is idle).
CREATE TABLE agent_run_threads (
    tenant_id   text        NOT NULL,
    thread_id   text        NOT NULL,
    next_seq    bigint      NOT NULL DEFAULT 1,
    head_run_id uuid,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, thread_id),
    CONSTRAINT agent_run_threads_id_bounded
        CHECK (thread_id ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$')
);

ALTER TABLE agent_runs
    ADD COLUMN thread_id     text,
    ADD COLUMN thread_seq    bigint,
    ADD COLUMN thread_due_at timestamptz,
    -- Interrupted by a submit with multitask 'rollback': its result and
    -- events are kept, flagged, and never the thread's latest answer.
    ADD COLUMN rolled_back   boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT agent_runs_thread_id_bounded
        CHECK (thread_id ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$'),
    ADD CONSTRAINT agent_runs_thread_seq_iff_thread
        CHECK ((thread_id IS NULL) = (thread_seq IS NULL)),
    ADD CONSTRAINT agent_runs_thread_parked_in_thread
        CHECK (thread_due_at IS NULL OR thread_id IS NOT NULL);

-- A thread's runs in submit order (GET /v1/threads/{id}/runs).
CREATE INDEX agent_runs_thread_idx
    ON agent_runs (tenant_id, thread_id, thread_seq)
    WHERE thread_id IS NOT NULL;

-- A thread's parked runs, the next head first: only pending parked runs, so
-- the advance reads one entry however many of the thread's runs finished.
CREATE INDEX agent_runs_thread_parked_idx
    ON agent_runs (tenant_id, thread_id, thread_seq)
    WHERE thread_due_at IS NOT NULL AND status = 'pending';

-- The last line of defence of invariant 11: two leased runs of one thread
-- cannot be stored, whatever a bug upstream does (the claim would fail).
CREATE UNIQUE INDEX agent_runs_thread_active_idx
    ON agent_runs (tenant_id, thread_id)
    WHERE thread_id IS NOT NULL AND status = 'leased';


-- Concurrency keys (issue 27, invariant 5 generalised): a run may name a
-- concurrency_key (tenant-scoped); a pool limits how many runs of one
-- (tenant, key) are active at once. As a thread's, a key's runs over its
-- limit are parked out of the claim's indexes (delayed, available_at far
-- ahead, key_due_at their due time), so a key at its limit costs a claim
-- nothing; a run of the key that finishes hands its slot to the next parked
-- one (runlease_key_release, functions.sql). A run names a thread or a key,
-- not both.
ALTER TABLE agent_runs
    ADD COLUMN concurrency_key text,
    ADD COLUMN key_due_at      timestamptz,
    ADD CONSTRAINT agent_runs_key_bounded
        CHECK (concurrency_key ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$'),
    ADD CONSTRAINT agent_runs_key_parked_in_key
        CHECK (key_due_at IS NULL OR concurrency_key IS NOT NULL),
    ADD CONSTRAINT agent_runs_thread_or_key
        CHECK (thread_id IS NULL OR concurrency_key IS NULL);

-- One row per (pool, tenant, key) ever used: `active` counts the key's runs
-- that hold a slot (unfinished and not parked); its row lock serializes the
-- key's submits and hand-overs, so `active` never passes the limit.
CREATE TABLE agent_run_keys (
    pool       text    NOT NULL,
    tenant_id  text    NOT NULL,
    key        text    NOT NULL,
    active     integer NOT NULL DEFAULT 0 CHECK (active >= 0),
    PRIMARY KEY (pool, tenant_id, key)
);

-- A pool's limits per key: `key` '*' is the pool's default per-key limit
-- (no row: keys are unlimited), any other row that key's own limit (for
-- every tenant's key of that name). At least 1: a limit of 0 would park a
-- key's runs for ever.
CREATE TABLE agent_run_key_limits (
    pool          text    NOT NULL,
    key           text    NOT NULL,
    max_in_flight integer NOT NULL CHECK (max_in_flight BETWEEN 1 AND 100000),
    PRIMARY KEY (pool, key),
    CONSTRAINT agent_run_key_limits_key_bounded
        CHECK (key = '*' OR key ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$')
);

-- A key's parked runs, oldest first: the next to take a freed slot.
CREATE INDEX agent_runs_key_parked_idx
    ON agent_runs (pool, tenant_id, concurrency_key, id)
    WHERE key_due_at IS NOT NULL AND status = 'pending';


-- Singletons and debounce (issue 27): a (pool, tenant, key) names at most
-- one run a submit may answer with. Each row's lock serializes the key's
-- submits, so concurrent submits never make two runs where one is promised.
-- run_id: the key's latest run (NULL until the first submit commits).
CREATE TABLE agent_run_singletons (
    pool       text        NOT NULL,
    tenant_id  text        NOT NULL,
    key        text        NOT NULL,
    run_id     uuid,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, tenant_id, key),
    CONSTRAINT agent_run_singletons_key_bounded
        CHECK (key ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$')
);

-- first_at: when the key's pending run was first submitted; a debounced
-- submit pushes its start at most to first_at + max_delay_s.
CREATE TABLE agent_run_debounces (
    pool       text        NOT NULL,
    tenant_id  text        NOT NULL,
    key        text        NOT NULL,
    run_id     uuid,
    first_at   timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, tenant_id, key),
    CONSTRAINT agent_run_debounces_key_bounded
        CHECK (key ~ '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$')
);
