-- 0007: the NOTIFYs that transitions send, written once as functions (each was
-- repeated in several statements): a freed tenant slot, a run's new event, and
-- runs back to pending.

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
