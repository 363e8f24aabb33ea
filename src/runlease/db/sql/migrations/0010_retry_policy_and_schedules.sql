-- 0010: a retry policy per run, and schedules (issue 15).
-- The columns are added without defaults (NULL: the built-in policy), so no
-- table rewrite.
ALTER TABLE agent_runs
    ADD COLUMN backoff_base_s      integer CHECK (backoff_base_s BETWEEN 0 AND 86400),
    ADD COLUMN backoff_cap_s       integer CHECK (backoff_cap_s BETWEEN 0 AND 604800),
    ADD COLUMN non_retryable_codes text[]  CHECK (cardinality(non_retryable_codes) <= 32);

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

CREATE INDEX agent_run_schedules_due_idx
    ON agent_run_schedules (next_tick_at)
    WHERE NOT paused;
