-- The current definition of every runlease function and trigger.
--
-- The rule: a change to a table, column, constraint, index or data is a new
-- numbered file in migrations/; a change to a function or trigger is an edit
-- of this file, never a migration. runlease.db.migrate applies this file after
-- the numbered migrations, in the same transaction (so a write cannot slip
-- between a migration and the triggers that keep agent_run_counts), whenever
-- migrations were applied or this file's checksum differs from the one the
-- database recorded (runlease_migrations, version 0); otherwise it takes no
-- lock at all. Hence every statement here must be repeatable:
-- CREATE OR REPLACE. A change of a function's arguments or result type needs a
-- DROP FUNCTION IF EXISTS of the old signature first (CREATE OR REPLACE cannot
-- change them); a trigger's function must exist before its trigger.
--
-- Queue counts (agent_run_counts, migration 0008): a change of a run's counted
-- state appends a delta row; the reaper's leader folds them in.

-- The counted state of a run ('' when it is in none: leased, done). Done
-- runs are the 'total' (counted by the insert and delete triggers only) less
-- every other status, so an ack, the hot path, fires no trigger (migration
-- 0013 added cancelled and total).
CREATE OR REPLACE FUNCTION runlease_counted_state(p_status text, p_delayed boolean) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN p_status = 'pending' AND p_delayed THEN 'delayed'
            WHEN p_status IN ('pending', 'dead', 'cancelled') THEN p_status
            ELSE '' END;

-- Inserts and deletes: one statement-level trigger each, one delta row per
-- (pool, tenant, state) of the statement (a batch enqueue of 1,000 runs
-- appends one row). Updates: a row-level trigger whose WHEN passes only a
-- change of counted state, so heartbeats, acks and cancels of leased runs
-- (most updates) fire nothing. A claim (pending to leased, which only
-- runlease_claim does) fires nothing either: the claim appends one delta row
-- per (pool, tenant) of the runs it leased, in the statement that leases them
-- (a row trigger cost each claimed run an INSERT, ~15 % of the claim's CPU).
-- A statement-level update trigger cannot do it: transition tables forbid a
-- column list, so every heartbeat (1,000 rows a statement) would fill them.
CREATE OR REPLACE FUNCTION runlease_count_rows() RETURNS trigger
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

CREATE OR REPLACE FUNCTION runlease_count_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_old text := runlease_counted_state(OLD.status, OLD.delayed);
    v_new text := runlease_counted_state(NEW.status, NEW.delayed);
    v_old_code text := CASE WHEN v_old = 'dead' THEN coalesce(OLD.error_code, '') ELSE '' END;
    v_new_code text := CASE WHEN v_new = 'dead' THEN coalesce(NEW.error_code, '') ELSE '' END;
BEGIN
    -- The trigger's WHEN passes a superset: nothing counted may have changed.
    IF v_old = v_new AND v_old_code = v_new_code AND OLD.pool = NEW.pool
       AND OLD.tenant_id = NEW.tenant_id THEN
        RETURN NULL;
    END IF;
    INSERT INTO agent_run_count_deltas (pool, tenant_id, state, error_code, n)
    SELECT d.pool, d.tenant_id, d.state, d.error_code, d.n
      FROM (VALUES (OLD.pool, OLD.tenant_id, v_old, v_old_code, -1::bigint),
                   (NEW.pool, NEW.tenant_id, v_new, v_new_code, 1::bigint))
           AS d (pool, tenant_id, state, error_code, n)
     WHERE d.state <> '';
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER agent_runs_count_insert AFTER INSERT ON agent_runs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION runlease_count_rows();

CREATE OR REPLACE TRIGGER agent_runs_count_delete AFTER DELETE ON agent_runs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION runlease_count_rows();

-- Only for an update that sets a column a count depends on: an update that
-- sets none of them (a heartbeat, a usage write) is passed over by its column
-- list alone, without reading the row for the WHEN. The WHEN is plain
-- comparisons, no call of runlease_counted_state: every UPDATE statement
-- parses and simplifies its triggers' WHEN once, and inlining four calls was
-- a tenth of a one-run claim's or ack's server CPU. It passes a superset of
-- the changes of counted state (a status, delay, code, pool or tenant
-- change where either side is in a counted status), less claims (counted by
-- runlease_claim); runlease_count_change writes nothing when nothing counted
-- changed. An ack (leased to done) is passed over: neither side counted.
CREATE OR REPLACE TRIGGER agent_runs_count_update
    AFTER UPDATE OF status, delayed, error_code, pool, tenant_id ON agent_runs
    FOR EACH ROW
    WHEN ((OLD.status IN ('pending', 'dead', 'cancelled')
           OR NEW.status IN ('pending', 'dead', 'cancelled'))
          AND NOT (OLD.status = 'pending' AND NEW.status = 'leased')
          AND (OLD.status <> NEW.status OR OLD.delayed <> NEW.delayed
               OR OLD.error_code IS DISTINCT FROM NEW.error_code
               OR OLD.pool <> NEW.pool OR OLD.tenant_id <> NEW.tenant_id))
    EXECUTE FUNCTION runlease_count_change();

-- input_json and budget_json are objects (migration 0012 dropped the CHECKs
-- that said so: every UPDATE re-checks every CHECK, and jsonb_typeof
-- detoasts the whole input, a conversation often compressed or out of line,
-- at each heartbeat). The same rule, checked when the value is written; the
-- error is the one a CHECK raises (check_violation, the constraint's name).
CREATE OR REPLACE FUNCTION runlease_refuse_non_object() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_name text := CASE WHEN jsonb_typeof(NEW.input_json) <> 'object'
                        THEN 'agent_runs_input_is_object'
                        ELSE 'agent_runs_budget_is_object' END;
BEGIN
    RAISE EXCEPTION 'new row for relation "agent_runs" violates check constraint "%"', v_name
        USING ERRCODE = 'check_violation', CONSTRAINT = v_name, TABLE = 'agent_runs',
              SCHEMA = TG_TABLE_SCHEMA;
END;
$$;

-- AFTER, not BEFORE: a BEFORE UPDATE trigger, even one for other columns,
-- locks and re-reads every updated row before looking at its column list
-- (and a BEFORE INSERT row trigger would turn off COPY's batched inserts).
CREATE OR REPLACE TRIGGER agent_runs_objects_check
    AFTER INSERT OR UPDATE OF input_json, budget_json ON agent_runs
    FOR EACH ROW
    WHEN (jsonb_typeof(NEW.input_json) <> 'object' OR jsonb_typeof(NEW.budget_json) <> 'object')
    EXECUTE FUNCTION runlease_refuse_non_object();

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
CREATE OR REPLACE FUNCTION runlease_claim(
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
    ), claimed AS (
        UPDATE agent_runs r
           SET status = 'leased', locked_by = p_worker, locked_until = v_now
               + make_interval(secs => coalesce(p_lease_s, v_lease_s)),
               attempts = r.attempts + 1, lease_epoch = r.lease_epoch + 1, updated_at = v_now,
               -- Who holds this lease (agent_runs.holders, migration 0013): the
               -- console's attempts history; the last 16 claims.
               holders = (CASE WHEN jsonb_array_length(r.holders) >= 16 THEN r.holders - 0
                               ELSE r.holders END)
                         || jsonb_build_object('worker', p_worker, 'attempt', r.attempts + 1,
                                               'at', v_now, 'seq', r.event_seq)
          FROM chosen
         WHERE r.id = chosen.id
        RETURNING r.id, r.pool, r.tenant_id, r.priority, r.attempts, r.max_attempts,
                  r.lease_epoch, r.locked_until, r.cancel_requested_at, r.input_json,
                  r.budget_json, r.created_at, r.available_at, r.updated_at, chosen.nth
    ), counted AS (
        -- The counts' delta of this claim (the count trigger passes claims
        -- over): each leased run left 'pending' (it was ready, not delayed:
        -- locked above with that condition, so still so).
        INSERT INTO agent_run_count_deltas (pool, tenant_id, state, error_code, n)
        SELECT c.pool, c.tenant_id, 'pending', '', -count(*)
          FROM claimed c
         GROUP BY c.pool, c.tenant_id
    )
    -- Only what a worker needs; nth is the claim order (the caller sorts).
    SELECT c.id, c.pool, c.tenant_id, c.priority, c.attempts, c.max_attempts,
           c.lease_epoch, c.locked_until, c.cancel_requested_at, c.input_json,
           c.budget_json, c.created_at, c.available_at, c.updated_at, c.nth
      FROM claimed c;
END;
$$;

-- A finished lease frees a slot of its tenant: in a pool with tenant limits,
-- NOTIFY the pool so a claimer waiting on a capped tenant claims its next run
-- now, not at its next poll. Called by ack, nack, fail and finalize_cancel
-- with the pools of the runs they ended (repeats are fine); returns how many
-- notifications it sent. plpgsql: its plan is cached per session, and ack is
-- the hot path.
CREATE OR REPLACE FUNCTION runlease_notify_freed(p_channel_prefix text, p_pools text[])
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
CREATE OR REPLACE FUNCTION runlease_notify_events(p_runs uuid[], p_seqs bigint[]) RETURNS bigint
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
CREATE OR REPLACE FUNCTION runlease_notify_pending(p_channel_prefix text, p_pools text[])
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT count(pg_notify(p_channel_prefix || p.name, p.name))
              FROM (SELECT DISTINCT x.name FROM unnest(p_pools) AS x (name)) p);
END;
$$;
