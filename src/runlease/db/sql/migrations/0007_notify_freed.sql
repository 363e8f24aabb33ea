-- 0007: the NOTIFY that ack, nack, fail and finalize_cancel send when they free
-- a tenant's slot, written once as a function (it was repeated in each).

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
