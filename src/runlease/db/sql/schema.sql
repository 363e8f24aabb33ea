-- The runlease schema: this file is the truth.
--
-- The numbered files in migrations/ must produce exactly this schema;
-- tests/integration/test_migrations.py applies both to empty databases and
-- compares pg_dump's output. docs/schema.md explains the choices below.

-- Pools: named partitions of the queue and their defaults. Enqueue, claim, the
-- API and the operator all read this table, so `default` always exists.
CREATE TABLE agent_run_pools (
    name                  text        PRIMARY KEY
                                      CHECK (name ~ '^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$'),
    max_attempts          integer     NOT NULL DEFAULT 3 CHECK (max_attempts BETWEEN 1 AND 100),
    lease_s               integer     NOT NULL DEFAULT 45 CHECK (lease_s BETWEEN 1 AND 3600),
    -- NULL: tenants without an override are not limited.
    default_max_in_flight integer     CHECK (default_max_in_flight >= 0),
    -- Seconds of waiting that raise a pending run's effective priority by one;
    -- 0 turns aging off (strict priorities).
    priority_aging_s      integer     NOT NULL DEFAULT 60 CHECK (priority_aging_s >= 0),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- Finished runs older than this are deleted by the reaper's leader; 0 keeps them.
    retention_s           integer     NOT NULL DEFAULT 604800 CHECK (retention_s >= 0),
    -- A paused pool takes runs but no worker claims them; leased runs go on.
    paused                boolean     NOT NULL DEFAULT false,
    -- Names of worker environment variables this pool's tools may see
    -- (the store refuses the worker's own: RUNLEASE_*, DATABASE_URL, PG*).
    tool_env              text[]      NOT NULL DEFAULT '{}'
                                      CONSTRAINT agent_run_pools_tool_env_check
                                      CHECK (cardinality(tool_env) <= 64
                                             AND (cardinality(tool_env) = 0
                                                  OR array_to_string(tool_env, ' ', ' ')
                                                     ~ '^[A-Z_][A-Z0-9_]{0,127}( [A-Z_][A-Z0-9_]{0,127})*$')),
    -- The AgentRunPool ("namespace/name") whose operator writes this row; NULL
    -- for a pool made through the API or CLI. Two AgentRunPools naming one pool
    -- (the same name in two namespaces) would otherwise share its queue.
    owner                 text        CHECK (length(owner) BETWEEN 3 AND 317)
);

INSERT INTO agent_run_pools (name) VALUES ('default');

-- Per-tenant settings of a pool. max_in_flight caps runs leased at once
-- (NULL: the pool's default_max_in_flight; 0 pauses the tenant). The priority
-- band bounds the priorities the tenant may submit (NULL: -100 or 100); a
-- submit outside it is refused. Priority only orders a tenant's own runs.
CREATE TABLE agent_run_tenant_limits (
    pool          text        NOT NULL REFERENCES agent_run_pools (name) ON DELETE CASCADE,
    tenant_id     text        NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 128),
    max_in_flight integer     CHECK (max_in_flight >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    priority_min  integer     CHECK (priority_min BETWEEN -100 AND 100),
    priority_max  integer     CHECK (priority_max BETWEEN -100 AND 100),
    -- Rates (NULL: none): runs submitted per minute (more is an HTTP 429),
    -- and model tokens per minute (input plus output, from the usage log: a
    -- tenant over it has no run claimed until its last minute is under it).
    submits_per_minute integer CHECK (submits_per_minute BETWEEN 1 AND 100000),
    tokens_per_minute  bigint  CHECK (tokens_per_minute BETWEEN 1 AND 1000000000000),
    PRIMARY KEY (pool, tenant_id),
    CONSTRAINT agent_run_tenant_limits_band_check CHECK (priority_min <= priority_max)
);

-- The hot table. Heartbeats rewrite locked_until every few seconds, so no
-- index mentions locked_until (or updated_at, or event_seq): those updates
-- stay HOT, and fillfactor leaves room on each page for the new versions.
-- There is deliberately no foreign key on pool: every insert would share-lock
-- the one pool row and serialize concurrent enqueues on MultiXacts; enqueue
-- checks the pool itself.
CREATE TABLE agent_runs (
    id                  uuid        PRIMARY KEY,
    pool                text        NOT NULL DEFAULT 'default',
    tenant_id           text        NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 128),
    status              text        NOT NULL DEFAULT 'pending'
                                    CHECK (status IN ('pending', 'leased', 'done', 'dead', 'cancelled')),
    priority            integer     NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),
    -- Position in the pool's fair order: start tags of a start-time fair
    -- queue, assigned at enqueue (see run_enqueue), across priorities.
    fair_seq            bigint      NOT NULL DEFAULT 0,
    attempts            integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts        integer     NOT NULL DEFAULT 3 CHECK (max_attempts BETWEEN 1 AND 100),
    -- The fencing token: +1 at every claim.
    lease_epoch         bigint      NOT NULL DEFAULT 0,
    available_at        timestamptz NOT NULL DEFAULT now(),
    locked_until        timestamptz,
    locked_by           text,
    cancel_requested_at timestamptz,
    budget_json         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    input_json          jsonb       NOT NULL,
    result_json         jsonb,
    idempotency_key     text        CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    -- Last event sequence number handed out for this run (see run_events.sql).
    event_seq           bigint      NOT NULL DEFAULT 0,
    error_code          text,
    error_message       text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    -- A pending run in backoff (nacked, available_at ahead): kept out of the
    -- claim's indexes until its time comes (runlease_claim promotes it), so
    -- runs waiting for minutes cost a claim nothing.
    delayed             boolean     NOT NULL DEFAULT false,
    -- The run's labels, a string map (bounded in core/bounds.py); found
    -- through agent_run_labels, never through an index here.
    labels              jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- The run's retry policy (NULL: the built-in one, core/backoff.py): the
    -- delay after the n-th failed attempt is min(cap, base * 2^(n-1)), and a
    -- failure with one of non_retryable_codes is dead at once (run_nack).
    backoff_base_s      integer     CHECK (backoff_base_s BETWEEN 0 AND 86400),
    backoff_cap_s       integer     CHECK (backoff_cap_s BETWEEN 0 AND 604800),
    non_retryable_codes text[]      CHECK (cardinality(non_retryable_codes) <= 32),
    -- Usage summed over every attempt (RunContext.record_usage, begin_turn,
    -- run_tool): a retried run's budget resumes with what is left.
    input_tokens        bigint      NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    output_tokens       bigint      NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    cost                numeric     NOT NULL DEFAULT 0 CHECK (cost >= 0),
    turns_used          integer     NOT NULL DEFAULT 0 CHECK (turns_used >= 0),
    tool_calls_used     integer     NOT NULL DEFAULT 0 CHECK (tool_calls_used >= 0),
    -- Child runs: the run that submitted this one (same tenant). No foreign
    -- key, as for pool: a parent deleted by retention leaves its children be.
    parent_run_id       uuid,
    -- A parent waiting for its children (RunContext.wait_children): pending
    -- and delayed with available_at far ahead, holding no worker slot, until
    -- the reaper's leader finds its children finished and makes it due.
    awaiting_children   boolean     NOT NULL DEFAULT false,
    -- Who held each lease: the claim appends {worker, attempt, at, seq} (seq:
    -- the run's event_seq then, so the event that ended the attempt is the
    -- first attempt-ending run.* event after it). The last 16 claims only;
    -- the console's attempts history reads it. Written by the claim's own
    -- UPDATE (no statement added), never indexed.
    holders             jsonb       NOT NULL DEFAULT '[]'::jsonb,
    CONSTRAINT agent_runs_finished_iff_terminal
        CHECK ((status IN ('done', 'dead', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT agent_runs_lease_iff_leased
        CHECK ((status = 'leased') = (locked_by IS NOT NULL AND locked_until IS NOT NULL)),
    CONSTRAINT agent_runs_attempts_bounded CHECK (attempts <= max_attempts),
    CONSTRAINT agent_runs_pending_not_cancelled
        CHECK (status <> 'pending' OR cancel_requested_at IS NULL),
    CONSTRAINT agent_runs_dead_has_code CHECK (status <> 'dead' OR error_code IS NOT NULL),
    CONSTRAINT agent_runs_input_is_object CHECK (jsonb_typeof(input_json) = 'object'),
    CONSTRAINT agent_runs_budget_is_object CHECK (jsonb_typeof(budget_json) = 'object')
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- Enqueue: the head of a pool's fair order (where a new tenant's runs join).
-- Ready runs only: pending and not in backoff (see delayed).
CREATE INDEX agent_runs_claim_idx
    ON agent_runs (pool, fair_seq, id)
    WHERE status = 'pending' AND NOT delayed;

-- Leases: reap scans it for expired ones; claim counts a tenant's in-flight
-- runs from it. Keyed on columns a heartbeat never changes.
CREATE INDEX agent_runs_leased_idx
    ON agent_runs (pool, tenant_id)
    WHERE status = 'leased';

-- Claim: the tenants with ready runs (one descent each, a loose index scan)
-- and each tenant's line in the fair order; enqueue: where a tenant's line
-- ends. Capped tenants are skipped by tenant, so their backlogs are not read.
CREATE INDEX agent_runs_pending_tenant_idx
    ON agent_runs (pool, tenant_id, fair_seq, id)
    WHERE status = 'pending' AND NOT delayed;

-- Claim: a tenant's own ready runs by priority, to fill the places it is given.
CREATE INDEX agent_runs_pending_priority_idx
    ON agent_runs (pool, tenant_id, priority DESC, fair_seq, id)
    WHERE status = 'pending' AND NOT delayed;

-- Claim: runs in backoff whose time has come, to make them ready again.
CREATE INDEX agent_runs_delayed_idx
    ON agent_runs (pool, available_at)
    WHERE status = 'pending' AND delayed;

-- A run's children (listing, waiting, cancel cascade); most runs have no parent.
CREATE INDEX agent_runs_parent_idx
    ON agent_runs (parent_run_id, id)
    WHERE parent_run_id IS NOT NULL;

-- Parents waiting for their children: what the leader's wake pass scans.
CREATE INDEX agent_runs_awaiting_idx
    ON agent_runs (id)
    WHERE awaiting_children AND status = 'pending';

CREATE UNIQUE INDEX agent_runs_idempotency_idx
    ON agent_runs (pool, tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE INDEX agent_runs_dead_idx ON agent_runs (id) WHERE status = 'dead';

-- The reaper: a worker's leases, found by its identity. locked_by is set by
-- the claim and never changes while the lease is renewed, so heartbeats stay
-- HOT; the reaper reads only the leases of workers whose registry row
-- expired (or that never registered), plus a bounded sweep by (locked_by, id).
CREATE INDEX agent_runs_holder_idx
    ON agent_runs (locked_by, id)
    WHERE status = 'leased';

-- Retention: each pool's finished runs in the order they finished, so a
-- batch reads only what it deletes (not the live runs below an id cutoff).
CREATE INDEX agent_runs_finished_idx
    ON agent_runs (pool, finished_at)
    WHERE finished_at IS NOT NULL;

-- Queue stats: the oldest ready run's wait (one descent), not a scan of the
-- pool's pending runs. available_at changes only on transitions that are not
-- HOT anyway.
CREATE INDEX agent_runs_ready_idx
    ON agent_runs (pool, available_at)
    WHERE status = 'pending' AND NOT delayed;

-- A tenant's runs, newest first (ids are UUIDv7, so id order is creation
-- order), for listing. A side table written once at enqueue instead of an
-- index on agent_runs: every claim and ack is a non-HOT update that adds an
-- entry to every full index of agent_runs, and measured, a (tenant_id, id)
-- index there cost a quarter of claim+ack throughput. This table is never
-- updated; the retention statement deletes from it with the runs (no foreign
-- key: a cascade would need a second index to find the rows).
CREATE TABLE agent_run_tenant_index (
    tenant_id text NOT NULL,
    run_id    uuid NOT NULL,
    PRIMARY KEY (tenant_id, run_id)
);

-- A run's labels, one row each, written once at enqueue (labels never
-- change): finding a tenant's runs by label is one range scan, newest first,
-- instead of an index on agent_runs that every claim and ack would update.
-- Deleted with the runs by the retention statements (no foreign key, as above).
CREATE TABLE agent_run_labels (
    tenant_id text NOT NULL,
    key       text NOT NULL,
    value     text NOT NULL,
    run_id    uuid NOT NULL,
    PRIMARY KEY (tenant_id, key, value, run_id)
);

-- Admins search a label across tenants.
CREATE INDEX agent_run_labels_any_tenant_idx ON agent_run_labels (key, value, run_id);

-- Events of a run, in order. seq is handed out under the run's row lock, so
-- events become visible in seq order and a stream can resume after any seq.
CREATE TABLE agent_run_events (
    run_id     uuid        NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    seq        bigint      NOT NULL CHECK (seq > 0),
    kind       text        NOT NULL CHECK (length(kind) BETWEEN 1 AND 64),
    data       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);

-- The operator's lease-health condition counts recent lease expiries.
CREATE INDEX agent_run_events_lease_expired_idx
    ON agent_run_events (created_at)
    WHERE kind = 'run.lease_expired';

-- Durable step results: a step committed by any attempt is not run again.
CREATE TABLE agent_run_steps (
    run_id      uuid        NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    step_key    text        NOT NULL CHECK (length(step_key) BETWEEN 1 AND 255),
    result      jsonb       NOT NULL,
    lease_epoch bigint      NOT NULL,
    attempt     integer     NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, step_key)
);

-- Schedules (runlease.services.scheduler): a cron expression in a time zone
-- and a run template (the submit body). The scheduler's leader enqueues a
-- due tick in the transaction that moves next_tick_at on, with an
-- idempotency key per tick, so a leader change neither doubles nor skips one.
CREATE TABLE agent_run_schedules (
    id           uuid        PRIMARY KEY,
    tenant_id    text        NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 128),
    name         text        NOT NULL CHECK (name ~ '^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$'),
    cron         text        NOT NULL CHECK (length(cron) BETWEEN 9 AND 255),
    timezone     text        NOT NULL DEFAULT 'UTC' CHECK (length(timezone) BETWEEN 1 AND 64),
    pool         text        NOT NULL,
    template     jsonb       NOT NULL CHECK (jsonb_typeof(template) = 'object'),
    overlap      text        NOT NULL DEFAULT 'skip' CHECK (overlap IN ('skip', 'allow')),
    paused       boolean     NOT NULL DEFAULT false,
    next_tick_at timestamptz NOT NULL,
    last_tick_at timestamptz,
    last_run_id  uuid,
    -- Why the last due tick enqueued nothing (overlap, or a template the
    -- pool refuses now); NULL once a tick enqueues again.
    last_error   text        CHECK (length(last_error) <= 1024),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);

-- The scheduler: schedules whose next tick is due.
CREATE INDEX agent_run_schedules_due_idx
    ON agent_run_schedules (next_tick_at)
    WHERE NOT paused;

-- Usage as it is recorded, one row per record_usage: the last minutes of it
-- answer a tenant's token rate (runlease_claim), the rest is folded into
-- agent_usage_daily by the reaper's leader and deleted. No foreign key: a
-- run deleted by retention keeps what it spent.
CREATE TABLE agent_run_usage_log (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pool          text        NOT NULL,
    tenant_id     text        NOT NULL,
    run_id        uuid        NOT NULL,
    input_tokens  bigint      NOT NULL CHECK (input_tokens >= 0),
    output_tokens bigint      NOT NULL CHECK (output_tokens >= 0),
    cost          numeric     NOT NULL CHECK (cost >= 0),
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX agent_run_usage_log_tenant_idx
    ON agent_run_usage_log (pool, tenant_id, created_at);

CREATE INDEX agent_run_usage_log_created_idx ON agent_run_usage_log (created_at);

-- Usage per tenant, pool and UTC day (GET /v1/usage reads it with the log's
-- rows not folded yet).
CREATE TABLE agent_usage_daily (
    tenant_id     text        NOT NULL,
    pool          text        NOT NULL,
    day           date        NOT NULL,
    input_tokens  bigint      NOT NULL DEFAULT 0,
    output_tokens bigint      NOT NULL DEFAULT 0,
    cost          numeric     NOT NULL DEFAULT 0,
    records       bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, pool, day)
);

-- Completion webhooks. Hosts a run's webhook_url may name, as the admin
-- configures them (`*.example.com` matches subdomains); allow_private lets
-- the host resolve to loopback, private or link-local addresses.
CREATE TABLE runlease_webhook_hosts (
    pattern       text        PRIMARY KEY
                              CHECK (pattern ~ '^(\*\.)?[a-z0-9]([a-z0-9.:\[\]-]{0,251}[a-z0-9\]])?$'),
    allow_private boolean     NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Each tenant's signing key: deliveries carry HMAC-SHA256(secret, timestamp
-- "." body), so a tenant can check them and no tenant can forge another's.
CREATE TABLE agent_webhook_secrets (
    tenant_id     text        PRIMARY KEY CHECK (length(tenant_id) BETWEEN 1 AND 128),
    secret        text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- One delivery per run that named a webhook_url: waiting until the run is
-- finished, then POSTed by the reaper's leader, retried with backoff;
-- attempts keeps the last ones ({at, status_code, error}).
CREATE TABLE agent_run_webhooks (
    run_id        uuid        PRIMARY KEY REFERENCES agent_runs (id) ON DELETE CASCADE,
    tenant_id     text        NOT NULL,
    url           text        NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    state         text        NOT NULL DEFAULT 'waiting'
                              CHECK (state IN ('waiting', 'delivered', 'failed')),
    tries         integer     NOT NULL DEFAULT 0,
    next_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at  timestamptz,
    attempts      jsonb       NOT NULL DEFAULT '[]'::jsonb,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX agent_run_webhooks_waiting_idx
    ON agent_run_webhooks (next_at)
    WHERE state = 'waiting';

-- Leader election (runlease.services.leader): one row per role, such as the
-- reaper; whoever finds it expired takes it, and the term grows at every change.
CREATE TABLE runlease_leaders (
    name       text        PRIMARY KEY,
    leader_id  text        NOT NULL,
    term       bigint      NOT NULL CHECK (term > 0),
    elected_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

-- Worker processes (runlease.db.workers): each registers at start, its lease
-- keeper renews the row in the statement that renews its leases, a clean
-- shutdown deletes it, and the reaper's leader deletes rows expired long
-- ago. The reaper looks for expired leases only among the runs of workers
-- whose row expired (or that have none): one row per process, so a small
-- table, read whole. No index but the key: renewals stay HOT.
CREATE TABLE agent_run_workers (
    id           text        PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 255),
    pool         text        NOT NULL CHECK (length(pool) BETWEEN 1 AND 48),
    version      text        NOT NULL CHECK (length(version) BETWEEN 1 AND 64),
    concurrency  integer     NOT NULL CHECK (concurrency >= 0),
    runs_held    integer     NOT NULL DEFAULT 0 CHECK (runs_held >= 0),
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    -- Fenced writes of this worker that matched no row (its lease was gone)
    -- and that the reaper's leader has not yet moved into
    -- agent_run_pool_health: the heartbeat adds what the worker saw since
    -- its last beat.
    stale_writes bigint      NOT NULL DEFAULT 0 CHECK (stale_writes >= 0)
) WITH (fillfactor = 50);

-- Lease health per pool and minute, for the console's pools page (the last
-- hour): expired leases, counted by the reap statement itself, and stale
-- writes, folded in from the workers' registry rows. Both by the reaper's
-- leader, which also deletes minutes older than a day: a small table.
CREATE TABLE agent_run_pool_health (
    pool           text        NOT NULL,
    minute         timestamptz NOT NULL,
    lease_expiries bigint      NOT NULL DEFAULT 0,
    stale_writes   bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (pool, minute)
);

-- Queue counts kept as they change (runlease.db.stats): the operator's
-- autoscaler and the console read them every few seconds, and counting a
-- million pending runs each time cost a scan of them all. Only the states
-- that can grow without bound are counted: pending (ready), delayed (pending
-- in backoff) and dead (by error code); leased runs are counted from
-- agent_runs_leased_idx (bounded by what is in flight). A change appends a
-- delta row (insert-only: no row every writer updates); the reaper's leader
-- folds the deltas into agent_run_counts every pass; a read sums both.
-- Cancelled runs are counted too (a cancel is never on the hot path), and
-- 'total' counts every run (by the statement-level insert and delete
-- triggers only): done runs are the total less every other status, so an
-- ack, the hot path, fires no trigger.
CREATE TABLE agent_run_counts (
    pool       text   NOT NULL,
    tenant_id  text   NOT NULL,
    state      text   NOT NULL
                      CHECK (state IN ('pending', 'delayed', 'dead', 'cancelled', 'total')),
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

-- The counted state of a run ('' when it is in none: leased, done).
CREATE FUNCTION runlease_counted_state(p_status text, p_delayed boolean) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN p_status = 'pending' AND p_delayed THEN 'delayed'
            WHEN p_status IN ('pending', 'dead', 'cancelled') THEN p_status
            ELSE '' END;

-- Inserts and deletes: one statement-level trigger each, one delta row per
-- (pool, tenant, state) of the statement (a batch enqueue of 1,000 runs
-- appends one row). Updates: a row-level trigger whose WHEN passes only a
-- change of counted state, so heartbeats, acks and cancels of leased runs
-- (most updates) fire nothing.
CREATE FUNCTION runlease_count_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Each run twice: in its counted state (if any) and in 'total'.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO agent_run_count_deltas (pool, tenant_id, state, error_code, n)
        SELECT r.pool, r.tenant_id, s.state,
               CASE WHEN s.state = 'dead' THEN coalesce(r.error_code, '') ELSE '' END,
               count(*)
          FROM new_rows r
         CROSS JOIN LATERAL (VALUES (runlease_counted_state(r.status, r.delayed)),
                                    ('total')) AS s (state)
         WHERE s.state <> ''
         GROUP BY 1, 2, 3, 4;
    ELSE
        INSERT INTO agent_run_count_deltas (pool, tenant_id, state, error_code, n)
        SELECT r.pool, r.tenant_id, s.state,
               CASE WHEN s.state = 'dead' THEN coalesce(r.error_code, '') ELSE '' END,
               -count(*)
          FROM old_rows r
         CROSS JOIN LATERAL (VALUES (runlease_counted_state(r.status, r.delayed)),
                                    ('total')) AS s (state)
         WHERE s.state <> ''
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

-- Claim up to p_n runs of a pool for one worker: one call, one short
-- transaction, plans cached by PL/pgSQL.
--
-- Fairness first, then priority. The pool's fair order (fair_seq, assigned at
-- enqueue) hands out places in turn: the first p_n available runs in that
-- order are this claim's places, and each place belongs to its run's tenant.
-- A tenant's own priority then decides which of its runs fills its places:
-- among its place holders and its highest-priority available runs, the best
-- by effective priority (its priority plus one per priority_aging_s seconds
-- waited, so a low-priority run cannot starve). Priority never moves a run
-- ahead of another tenant's. A place holder passed over takes the fair_seq of
-- the run that used its place, so the tenant's remaining places stay where
-- they were: a tenant cannot keep a place at the head by holding one old run.
--
-- Costs flat in what waits: the places are not read off one scan of the
-- pool's fair order (which would pass every run of a capped tenant and every
-- run in backoff ahead of the first claimable one) but merged from each
-- claimable tenant's own line: the tenants with ready runs come from a loose
-- index scan of agent_runs_pending_tenant_idx, capped ones are dropped by
-- name, and each remaining tenant gives at most its first few ready runs
-- (those up to the window's bound, below).
-- Runs in backoff are in none of these indexes (delayed); the claim first
-- moves a bounded batch of those whose time has come back into them.
--
-- Paused pools claim nothing. Tenant limits: when the pool has any,
-- claimers serialize per limited tenant on a transaction-level advisory lock
-- and count that tenant's leases in a statement that starts after the lock is
-- held, so the count includes every claim committed before: never more than
-- L leased, however many workers claim at once. A single statement cannot do
-- this, its snapshot predates any lock it takes; hence a function.
CREATE FUNCTION runlease_claim(
    p_pool text, p_worker text, p_n integer, p_lease_s integer, p_now timestamptz
) RETURNS TABLE (
    id uuid, pool text, tenant_id text, priority integer, attempts integer,
    max_attempts integer, lease_epoch bigint, locked_until timestamptz,
    cancel_requested_at timestamptz, input_json jsonb, budget_json jsonb,
    created_at timestamptz, available_at timestamptz, updated_at timestamptz,
    nth bigint
)
LANGUAGE plpgsql
-- Custom plans would be re-planned at every call (the planning costs more
-- than the claim); the generic plans use the same indexes.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now           timestamptz := coalesce(p_now, now());
    v_lease_s       integer;
    v_default_limit integer;
    v_aging_s       integer;
    v_paused        boolean;
    v_limited       boolean;
    v_skip          text[] := '{}';
    v_only          text[];
    v_slot_ids      uuid[];
    v_slot_tenants  text[];
    v_tenants       text[];
    v_takes         integer[];
    v_pick_ids      uuid[];
    v_pick_tenants  text[];
    v_pick_fair     bigint[];
    v_pick_k        bigint[];
    v_seen          uuid[] := '{}';
    v_cand          uuid[];
    v_got_ids       uuid[];
    v_got_tenants   text[];
    v_got_fair      bigint[];
    v_slot_fair     bigint[] := '{}';
    v_round         integer := 0;
    v_need          integer;
    v_window        integer;
    v_eligible      text[];
    v_k             integer;
    v_due           uuid[];
    v_rated         boolean;
BEGIN
    SELECT p.lease_s, p.default_max_in_flight, p.priority_aging_s, p.paused,
           p.default_max_in_flight IS NOT NULL
           OR EXISTS (SELECT 1 FROM agent_run_tenant_limits t
                       WHERE t.pool = p_pool AND t.max_in_flight IS NOT NULL),
           EXISTS (SELECT 1 FROM agent_run_tenant_limits t
                    WHERE t.pool = p_pool AND t.tokens_per_minute IS NOT NULL)
      INTO v_lease_s, v_default_limit, v_aging_s, v_paused, v_limited, v_rated
      FROM agent_run_pools p WHERE p.name = p_pool;
    IF NOT FOUND OR v_paused OR p_n < 1 THEN
        RETURN;
    END IF;

    IF v_default_limit = 0 THEN
        -- Every tenant without a positive override is paused: look only at
        -- those with one, or paused tenants' runs at the head of the fair
        -- order would fill every place and nobody would ever be claimed.
        SELECT coalesce(array_agg(t.tenant_id), '{}') INTO v_only
          FROM agent_run_tenant_limits t
         WHERE t.pool = p_pool AND t.max_in_flight > 0;
        IF cardinality(v_only) = 0 THEN
            RETURN;
        END IF;
    END IF;

    IF v_limited THEN
        -- Tenants at their limit by this snapshot: only a hint that keeps
        -- their runs out of the places; the exact count comes after the locks.
        SELECT coalesce(array_agg(x.tenant_id), '{}') INTO v_skip
          FROM (SELECT l.tenant_id
                  FROM (SELECT r.tenant_id, count(*) AS n
                          FROM agent_runs r
                         WHERE r.pool = p_pool AND r.status = 'leased'
                         GROUP BY r.tenant_id) l
                  LEFT JOIN agent_run_tenant_limits t
                    ON t.pool = p_pool AND t.tenant_id = l.tenant_id
                 WHERE l.n >= coalesce(t.max_in_flight, v_default_limit)
                UNION
                SELECT t.tenant_id FROM agent_run_tenant_limits t
                 WHERE t.pool = p_pool
                   AND coalesce(t.max_in_flight, v_default_limit) = 0) x;
    END IF;

    IF v_rated THEN
        -- Tenants over their token rate: the model tokens their runs logged
        -- in the last minute (agent_run_usage_log, by its tenant index). Their
        -- runs wait, in every claimer alike, until the minute is under the rate.
        v_skip := v_skip || ARRAY(
            SELECT t.tenant_id FROM agent_run_tenant_limits t
             WHERE t.pool = p_pool AND t.tokens_per_minute IS NOT NULL
               AND (SELECT coalesce(sum(l.input_tokens + l.output_tokens), 0)
                      FROM agent_run_usage_log l
                     WHERE l.pool = p_pool AND l.tenant_id = t.tenant_id
                       AND l.created_at > v_now - interval '60 seconds')
                   >= t.tokens_per_minute);
    END IF;

    -- Runs whose backoff is over become ready (a bounded batch per claim;
    -- what is left over is promoted by the next claims).
    SELECT array_agg(d.id) INTO v_due
      FROM (SELECT d.id FROM agent_runs d
             WHERE d.pool = p_pool AND d.status = 'pending' AND d.delayed
               AND d.available_at <= v_now
             ORDER BY d.available_at
             LIMIT 1000
               FOR UPDATE SKIP LOCKED) d;
    IF v_due IS NOT NULL THEN
        UPDATE agent_runs r SET delayed = false WHERE r.id = ANY (v_due);
    END IF;

    -- The places: the head of the pool's fair order among tenants that may
    -- claim, merged from each one's own line. The tenants with ready runs
    -- come from a loose index scan (one descent each), less the capped ones.
    WITH RECURSIVE tenants AS (
        (SELECT r.tenant_id FROM agent_runs r
          WHERE r.pool = p_pool AND r.status = 'pending' AND NOT r.delayed
          ORDER BY r.tenant_id LIMIT 1)
        UNION ALL
        SELECT (SELECT r.tenant_id FROM agent_runs r
                 WHERE r.pool = p_pool AND r.status = 'pending' AND NOT r.delayed
                   AND r.tenant_id > t.tenant_id
                 ORDER BY r.tenant_id LIMIT 1)
          FROM tenants t
         WHERE t.tenant_id IS NOT NULL
    )
    SELECT coalesce(array_agg(t.tenant_id), '{}') INTO v_eligible
      FROM tenants t
     WHERE t.tenant_id IS NOT NULL
       AND t.tenant_id <> ALL (v_skip)
       AND (v_only IS NULL OR t.tenant_id = ANY (v_only));
    IF cardinality(v_eligible) = 0 THEN
        RETURN;
    END IF;

    -- Each round looks at a window of the merged order, v_window runs
    -- (p_n, then 4 times more each round), none after a bound taken from the
    -- tenants' lines (so a tenant whose line starts later is not read). Rows another claimer
    -- holds are passed over (SKIP LOCKED); the next round looks past them
    -- with a wider window.
    v_slot_ids := '{}';
    v_slot_tenants := '{}';
    v_window := p_n;
    LOOP
        v_round := v_round + 1;
        v_need := p_n - cardinality(v_slot_ids);
        IF v_round > 1 THEN
            v_window := v_window * 4;
        END IF;
        -- The bound: with k = ceil(window / tenants), the j-th smallest of
        -- the tenants' k-th runs, j = ceil(window / k): j tenants have k runs
        -- each at or before it, so the window's runs all are. Each tenant
        -- then gives about window / tenants runs, not a whole window.
        v_k := ceil(v_window::numeric / cardinality(v_eligible))::integer;
        -- One statement, so one snapshot: the window holds v_window runs
        -- whenever that many are there to find.
        WITH kth AS (
            SELECT h.fair_seq
              FROM unnest(v_eligible) AS t (tenant_id)
             CROSS JOIN LATERAL (
                    SELECT r.fair_seq FROM agent_runs r
                     WHERE r.pool = p_pool AND r.tenant_id = t.tenant_id
                       AND r.status = 'pending' AND NOT r.delayed
                       AND r.available_at <= v_now
                       AND r.id <> ALL (v_seen)
                     ORDER BY r.fair_seq, r.id
                    OFFSET v_k - 1
                     LIMIT 1
                   ) h
        ), bound AS (
            -- Too few tenants with k runs: no bound.
            SELECT coalesce((SELECT kth.fair_seq FROM kth ORDER BY kth.fair_seq
                             OFFSET ceil(v_window::numeric / v_k)::integer - 1 LIMIT 1),
                            9223372036854775807) AS fair_seq
        )
        SELECT array_agg(c.id ORDER BY c.fair_seq, c.id)
          INTO v_cand
          FROM (SELECT h.id, h.fair_seq
                  FROM unnest(v_eligible) AS t (tenant_id)
                 CROSS JOIN LATERAL (
                        SELECT r.id, r.fair_seq FROM agent_runs r
                         WHERE r.pool = p_pool AND r.tenant_id = t.tenant_id
                           AND r.status = 'pending' AND NOT r.delayed
                           AND r.fair_seq <= (SELECT bound.fair_seq FROM bound)
                           AND r.available_at <= v_now
                           AND r.id <> ALL (v_seen)
                         ORDER BY r.fair_seq, r.id
                         LIMIT v_window
                       ) h
                 ORDER BY h.fair_seq, h.id
                 LIMIT v_window) c;
        EXIT WHEN v_cand IS NULL;
        SELECT array_agg(s.id), array_agg(s.tenant_id), array_agg(s.fair_seq)
          INTO v_got_ids, v_got_tenants, v_got_fair
          FROM (SELECT r.id, r.tenant_id, r.fair_seq
                  FROM agent_runs r
                 WHERE r.id = ANY (v_cand)
                   -- Written so no partial index's predicate is implied: by
                   -- primary key, not a full scan of an index for the ids.
                   AND (r.status = 'pending' AND NOT r.delayed) IS TRUE
                   AND r.available_at <= v_now
                   AND r.cancel_requested_at IS NULL
                 ORDER BY r.fair_seq, r.id
                 LIMIT v_need
                   FOR UPDATE SKIP LOCKED) s;
        v_slot_ids := v_slot_ids || coalesce(v_got_ids, '{}');
        v_slot_tenants := v_slot_tenants || coalesce(v_got_tenants, '{}');
        v_slot_fair := v_slot_fair || coalesce(v_got_fair, '{}');
        -- Done when full, when the window held everything there was, or
        -- after a few rounds (a claim that comes back short is repeated).
        EXIT WHEN cardinality(v_slot_ids) >= p_n OR cardinality(v_cand) < v_window
               OR v_round >= 6;
        v_seen := v_seen || v_cand;
    END LOOP;
    IF cardinality(v_slot_ids) = 0 THEN
        RETURN;
    END IF;
    -- Rounds after the first may have found runs ahead of earlier ones.
    SELECT array_agg(s.id ORDER BY s.f, s.id), array_agg(s.t ORDER BY s.f, s.id)
      INTO v_slot_ids, v_slot_tenants
      FROM unnest(v_slot_ids, v_slot_tenants, v_slot_fair) AS s (id, t, f);

    IF v_limited THEN
        -- Lock every limited tenant among the places, in one global order
        -- so two claimers can never wait for each other in a cycle.
        PERFORM pg_advisory_xact_lock(1381322316, k.key)
           FROM (SELECT DISTINCT hashtext(p_pool || '/' || c.tenant_id) AS key
                   FROM unnest(v_slot_tenants) AS c (tenant_id)
                   LEFT JOIN agent_run_tenant_limits t
                     ON t.pool = p_pool AND t.tenant_id = c.tenant_id
                  WHERE coalesce(t.max_in_flight, v_default_limit) IS NOT NULL
                  ORDER BY 1) k;
    END IF;

    -- A new statement, so a new snapshot: it sees every claim committed by
    -- whoever held a tenant's lock before us. How many places each tenant
    -- can use: all of them, or what its limit leaves.
    SELECT array_agg(k.tenant_id), array_agg(k.take)
      INTO v_tenants, v_takes
      FROM (SELECT d.tenant_id,
                   CASE WHEN v_limited
                             AND coalesce(t.max_in_flight, v_default_limit) IS NOT NULL
                        THEN least(d.places, coalesce(t.max_in_flight, v_default_limit)
                                   - (SELECT count(*) FROM agent_runs r
                                       WHERE r.pool = p_pool AND r.tenant_id = d.tenant_id
                                         AND r.status = 'leased'))
                        ELSE d.places END::integer AS take
              FROM (SELECT c.tenant_id, count(*) AS places
                      FROM unnest(v_slot_tenants) AS c (tenant_id)
                     GROUP BY c.tenant_id) d
              LEFT JOIN agent_run_tenant_limits t
                ON t.pool = p_pool AND t.tenant_id = d.tenant_id) k
     WHERE k.take > 0;
    IF v_tenants IS NULL THEN
        RETURN;
    END IF;

    -- Each tenant's own order fills its places: its place holders and its
    -- `take` highest-priority available runs compete by effective priority.
    WITH takes AS (
        SELECT * FROM unnest(v_tenants, v_takes) AS k (tenant_id, take)
    ), own AS (
        SELECT r.id, r.tenant_id, r.priority, r.fair_seq, r.available_at
          FROM agent_runs r
         WHERE r.id = ANY (v_slot_ids)
        UNION
        SELECT c.id, c.tenant_id, c.priority, c.fair_seq, c.available_at
          FROM takes k
         CROSS JOIN LATERAL (
                SELECT r.id, r.tenant_id, r.priority, r.fair_seq, r.available_at
                  FROM agent_runs r
                 WHERE r.pool = p_pool
                   AND r.tenant_id = k.tenant_id
                   AND r.status = 'pending' AND NOT r.delayed
                   AND r.available_at <= v_now
                   AND r.cancel_requested_at IS NULL
                 ORDER BY r.priority DESC, r.fair_seq, r.id
                 LIMIT k.take
                   FOR UPDATE SKIP LOCKED
               ) c
    ), ranked AS (
        SELECT o.id, o.tenant_id, o.fair_seq,
               row_number() OVER (
                   PARTITION BY o.tenant_id
                   ORDER BY o.priority + CASE WHEN v_aging_s > 0
                                              THEN extract(epoch FROM v_now - o.available_at)
                                                   / v_aging_s
                                              ELSE 0 END DESC,
                            o.priority DESC, o.fair_seq, o.id) AS k
          FROM own o
    )
    SELECT array_agg(r.id), array_agg(r.tenant_id), array_agg(r.fair_seq), array_agg(r.k)
      INTO v_pick_ids, v_pick_tenants, v_pick_fair, v_pick_k
      FROM ranked r
      JOIN takes USING (tenant_id)
     WHERE r.k <= takes.take;

    RETURN QUERY
    WITH places AS (
        SELECT s.id, s.tenant_id, s.ord,
               row_number() OVER (PARTITION BY s.tenant_id ORDER BY s.ord) AS k
          FROM unnest(v_slot_ids, v_slot_tenants) WITH ORDINALITY AS s (id, tenant_id, ord)
    ), picks AS (
        SELECT * FROM unnest(v_pick_ids, v_pick_tenants, v_pick_fair, v_pick_k)
                      AS p (id, tenant_id, fair_seq, k)
    ), used AS (
        -- The places spent: a tenant's first `take`, the k-th filled by its k-th pick.
        SELECT pl.id, pl.tenant_id, pl.ord, pl.k FROM places pl
         WHERE EXISTS (SELECT 1 FROM picks p WHERE p.tenant_id = pl.tenant_id AND p.k = pl.k)
    ), passed AS (
        SELECT u.id, u.tenant_id, row_number() OVER (PARTITION BY u.tenant_id ORDER BY u.ord) AS j
          FROM used u
         WHERE u.id NOT IN (SELECT p.id FROM picks p)
    ), freed AS (
        SELECT p.fair_seq, p.tenant_id,
               row_number() OVER (PARTITION BY p.tenant_id ORDER BY p.fair_seq, p.id) AS j
          FROM picks p
         WHERE p.id NOT IN (SELECT u.id FROM used u)
    ), moved AS (
        UPDATE agent_runs r
           SET fair_seq = f.fair_seq
          FROM passed x
          JOIN freed f USING (tenant_id, j)
         WHERE r.id = x.id
    ), chosen AS (
        SELECT p.id, row_number() OVER (ORDER BY u.ord) AS nth
          FROM picks p
          JOIN used u ON u.tenant_id = p.tenant_id AND u.k = p.k
    )
    -- Only what a worker needs; nth is the claim order (the caller sorts).
    UPDATE agent_runs r
       SET status = 'leased', locked_by = p_worker, locked_until = v_now
           + make_interval(secs => coalesce(p_lease_s, v_lease_s)),
           attempts = r.attempts + 1, lease_epoch = r.lease_epoch + 1, updated_at = v_now,
           holders = (CASE WHEN jsonb_array_length(r.holders) >= 16 THEN r.holders - 0
                           ELSE r.holders END)
                     || jsonb_build_object('worker', p_worker, 'attempt', r.attempts + 1,
                                           'at', v_now, 'seq', r.event_seq)
      FROM chosen
     WHERE r.id = chosen.id
    RETURNING r.id, r.pool, r.tenant_id, r.priority, r.attempts, r.max_attempts,
              r.lease_epoch, r.locked_until, r.cancel_requested_at, r.input_json,
              r.budget_json, r.created_at, r.available_at, r.updated_at, chosen.nth;
END;
$$;


-- A finished lease frees a slot of its tenant: in a pool with tenant limits,
-- NOTIFY the pool so a claimer waiting on a capped tenant claims its next run
-- now, not at its next poll. Called by ack, nack, fail and finalize_cancel
-- with the pools of the runs they ended (repeats are fine); returns how many
-- notifications it sent. plpgsql: its plan is cached per session, and ack is
-- the hot path.
CREATE FUNCTION runlease_notify_freed(p_channel_prefix text, p_pools text[])
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_sent bigint;
BEGIN
    SELECT count(pg_notify(p_channel_prefix || p.name, p.name)) INTO v_sent
      FROM agent_run_pools p
     WHERE p.name = ANY (p_pools)
       AND (p.default_max_in_flight IS NOT NULL
            OR EXISTS (SELECT 1 FROM agent_run_tenant_limits t WHERE t.pool = p.name));
    RETURN v_sent;
END;
$$;


-- A transition tells the event streams following its runs (channels.
-- EVENTS_CHANNEL) of each run's new event, 'id:seq', instead of their
-- polling. Called once per statement with parallel arrays (one array_agg
-- query keeps them in step); returns how many notifications it sent.
CREATE FUNCTION runlease_notify_events(p_runs uuid[], p_seqs bigint[]) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT count(pg_notify('runlease_events', e.id::text || ':' || e.seq))
              FROM unnest(p_runs, p_seqs) AS e (id, seq));
END;
$$;


-- Runs back to pending wake their pools' claimers now, not at their next
-- poll: one NOTIFY per pool (repeats are dropped). Called once per
-- statement with the pools of the runs it made pending; returns how many
-- notifications it sent.
CREATE FUNCTION runlease_notify_pending(p_channel_prefix text, p_pools text[])
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT count(pg_notify(p_channel_prefix || p.name, p.name))
              FROM (SELECT DISTINCT x.name FROM unnest(p_pools) AS x (name)) p);
END;
$$;
