-- 0011: agent economics. Usage summed per run across attempts, a log of
-- usage as recorded (a tenant's token rate) folded into a daily rollup;
-- per-tenant rates (submits and tokens per minute), the token rate checked
-- inside runlease_claim; child runs (parent_run_id, a parent waiting for them);
-- completion webhooks.
ALTER TABLE agent_runs
    ADD COLUMN input_tokens bigint NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    ADD COLUMN output_tokens bigint NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    ADD COLUMN cost numeric NOT NULL DEFAULT 0 CHECK (cost >= 0),
    ADD COLUMN turns_used integer NOT NULL DEFAULT 0 CHECK (turns_used >= 0),
    ADD COLUMN tool_calls_used integer NOT NULL DEFAULT 0 CHECK (tool_calls_used >= 0),
    ADD COLUMN parent_run_id uuid,
    ADD COLUMN awaiting_children boolean NOT NULL DEFAULT false;

CREATE INDEX agent_runs_parent_idx
    ON agent_runs (parent_run_id, id)
    WHERE parent_run_id IS NOT NULL;

CREATE INDEX agent_runs_awaiting_idx
    ON agent_runs (id)
    WHERE awaiting_children AND status = 'pending';

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

ALTER TABLE agent_run_tenant_limits
    ADD COLUMN submits_per_minute integer CHECK (submits_per_minute BETWEEN 1 AND 100000),
    ADD COLUMN tokens_per_minute bigint CHECK (tokens_per_minute BETWEEN 1 AND 1000000000000);

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

-- runlease_claim skips tenants over their token rate: ../functions.sql.
