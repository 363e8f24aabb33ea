-- 0001: the initial schema (agent_runs, events, steps, pools, tenant limits, claim).
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
    updated_at            timestamptz NOT NULL DEFAULT now()
);

INSERT INTO agent_run_pools (name) VALUES ('default');

-- Per-tenant caps on runs leased at once; a tenant without a row gets the
-- pool's default_max_in_flight. 0 pauses the tenant.
CREATE TABLE agent_run_tenant_limits (
    pool          text        NOT NULL REFERENCES agent_run_pools (name) ON DELETE CASCADE,
    tenant_id     text        NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 128),
    max_in_flight integer     NOT NULL CHECK (max_in_flight >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, tenant_id)
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
    -- Position in the pool's fair order within one priority: start tags of a
    -- start-time fair queue, assigned at enqueue (see run_enqueue).
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

-- Claim: the head of each priority level of a pool, in fair order.
CREATE INDEX agent_runs_claim_idx
    ON agent_runs (pool, priority DESC, fair_seq, id)
    WHERE status = 'pending';

-- Leases: reap scans it for expired ones; claim counts a tenant's in-flight
-- runs from it. Keyed on columns a heartbeat never changes.
CREATE INDEX agent_runs_leased_idx
    ON agent_runs (pool, tenant_id)
    WHERE status = 'leased';

-- Enqueue: where a tenant's own line ends in the fair order.
CREATE INDEX agent_runs_pending_tenant_idx
    ON agent_runs (pool, tenant_id, priority, fair_seq)
    WHERE status = 'pending';

CREATE UNIQUE INDEX agent_runs_idempotency_idx
    ON agent_runs (pool, tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE INDEX agent_runs_dead_idx ON agent_runs (id) WHERE status = 'dead';

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

-- runlease_claim and the other functions: ../functions.sql.
