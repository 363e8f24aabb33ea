-- 0016: webhook hosts name the ports beside 80 and 443 that URLs on them
-- may use (an allowed host is not a port scanner).
ALTER TABLE runlease_webhook_hosts
    ADD COLUMN ports integer[] NOT NULL DEFAULT '{}'
        CHECK (cardinality(ports) <= 16 AND 1 <= ALL (ports) AND 65535 >= ALL (ports));

-- A quota of waiting runs (pending, delayed included) per tenant and pool:
-- a submit past it is refused (429 queue_full), on every path that enqueues
-- for a tenant (API submits and batches, schedules' ticks, child runs). The
-- pool's default applies to tenants without their own; NULL: no quota.
-- Pools have 100,000 by default (a tenant queued that many in 9.5 s).
ALTER TABLE agent_run_pools
    ADD COLUMN default_max_pending integer DEFAULT 100000
        CHECK (default_max_pending BETWEEN 0 AND 100000000);
ALTER TABLE agent_run_tenant_limits
    ADD COLUMN max_pending integer CHECK (max_pending BETWEEN 0 AND 100000000);

-- Console sessions signed out (issue 32: a cookie stayed valid after sign
-- out until it expired): the session's nonce, kept until the cookie would
-- have expired anyway.
CREATE TABLE runlease_console_signouts (
    nonce      text        PRIMARY KEY CHECK (length(nonce) BETWEEN 1 AND 64),
    expires_at timestamptz NOT NULL
);
