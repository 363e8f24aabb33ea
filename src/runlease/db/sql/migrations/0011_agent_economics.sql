-- 0011: agent economics. Usage summed per run across attempts, a log of
-- usage as recorded (a tenant's token rate) folded into a daily rollup.
ALTER TABLE agent_runs
    ADD COLUMN input_tokens bigint NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    ADD COLUMN output_tokens bigint NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    ADD COLUMN cost numeric NOT NULL DEFAULT 0 CHECK (cost >= 0),
    ADD COLUMN turns_used integer NOT NULL DEFAULT 0 CHECK (turns_used >= 0),
    ADD COLUMN tool_calls_used integer NOT NULL DEFAULT 0 CHECK (tool_calls_used >= 0);

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
