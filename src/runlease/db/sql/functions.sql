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
            WHEN p_status IN ('pending', 'waiting', 'dead', 'cancelled') THEN p_status
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
    WHEN ((OLD.status IN ('pending', 'waiting', 'dead', 'cancelled')
           OR NEW.status IN ('pending', 'waiting', 'dead', 'cancelled'))
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

-- The claim, in named stages
-- ==========================
--
-- runlease_claim(pool, worker, n, now) leases up to n runs of a pool for one
-- worker incarnation, in one call and one short transaction. It is a short
-- orchestrator of stages, each a function of its own with its own EXPLAIN
-- test (tests/integration/test_claim_plans.py):
--
--   admit    the pool's terms: paused, tenant caps, token rates -> who may claim
--   promote  runs whose backoff has ended go back into the claim's indexes
--   tenants  the tenants with ready runs, less those that may not claim
--   places   the head of the pool's fair order: whose turn it is
--   recount  the capped tenants among the places, locked, their leases counted
--   fill     each tenant's own priority order fills its places
--   threads  a pick that is not its thread's head is dropped (issue 27)
--   lease    the chosen runs become leased by the incarnation
--
-- Fairness first, then priority. The pool's fair order (fair_seq, assigned at
-- enqueue) hands out places in turn: the first n available runs in that
-- order are this claim's places, and each place belongs to its run's tenant.
-- A tenant's own priority then decides which of its runs fills its places:
-- among its place holders and its highest-priority available runs, the best
-- by effective priority (its priority plus one per priority_aging_s seconds
-- waited, so a low-priority run cannot starve). Priority never moves a run
-- ahead of another tenant's. A place holder passed over takes the fair_seq of
-- the run that used its place, so the tenant's remaining places stay where
-- they were: a tenant cannot keep a place at the head by holding one old run.
--
-- Costs flat in what waits: the places are merged from each claimable
-- tenant's own line, not read off one scan of the pool's fair order (which
-- would pass every run of a capped tenant and every run in backoff ahead of
-- the first claimable one). Runs in backoff are in none of the claim's
-- indexes (delayed) until `promote` moves them back.
--
-- Plans that hold whatever the statistics say. Every stage reads agent_runs
-- through an index whose order is the order it wants, with a LIMIT; the
-- planner may only go wrong by believing a set is tiny (a table analyzed
-- empty, or with a million done runs, or never: the burst of runs onto an
-- idle pool that agent traffic is made of) and then preferring another
-- index of the same predicate plus a sort, which reads every pending run of
-- the pool per claim (measured: 15,000 rows read for 5 claimed; the drain 3
-- to 5 times slower until an autoanalyze). So each stage plans with
-- enable_sort off: a sort stays where no index can give the order, and
-- nowhere else. Generic plans (plan_cache_mode): custom plans would be
-- re-planned at every call, and the planning costs more than the claim.
-- A session plans each once, at its first claim, maybe while the table is
-- nearly empty, when a sequential scan looks cheaper than any index and
-- would stay in the plan for the session's life (measured: 10,011 rows read
-- per claim once a backlog came): enable_seqscan off too, so the plans are
-- the index plans whatever the table's size when they were made.


-- What a claim leases, by name (the store reads it by name).
DROP FUNCTION IF EXISTS runlease_claim(text, text, integer, integer, timestamptz);
-- Issue 27 added thread_id to what the claim and its lease stage return
-- (ctx.thread_id): a result type CREATE OR REPLACE cannot change.
DROP FUNCTION IF EXISTS runlease_claim(text, text, integer, timestamptz);
DROP FUNCTION IF EXISTS runlease_claim_lease(text, text, uuid[], text[], uuid[], text[], bigint[],
                                             bigint[], timestamptz);


-- Stage admit: the pool's terms for this claim. `is_open` is false when
-- nothing may be claimed at all: no such pool, paused, or every tenant paused
-- (a default cap of 0 and no positive override). `skip`: tenants at their
-- cap by this snapshot (a hint that keeps their runs out of the places; the
-- exact count comes in `recount`, after the locks) or over their token rate
-- (the model tokens their runs logged in the last minute). `only_tenants`:
-- with a default cap of 0, the tenants with a positive override, the only
-- ones to look at (or paused tenants' runs at the head of the fair order
-- would fill every place and nobody would ever be claimed).
CREATE OR REPLACE FUNCTION runlease_claim_admit(
    p_pool text, p_now timestamptz,
    OUT is_open boolean, OUT default_limit integer, OUT aging_s integer,
    OUT limited boolean, OUT skip text[], OUT only_tenants text[]
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
AS $$
DECLARE
    v_paused boolean;
    v_rated  boolean;
BEGIN
    is_open := false;
    skip := '{}';
    SELECT p.default_max_in_flight, p.priority_aging_s, p.paused,
           p.default_max_in_flight IS NOT NULL
           OR EXISTS (SELECT 1 FROM agent_run_tenant_limits t
                       WHERE t.pool = p_pool AND t.max_in_flight IS NOT NULL),
           EXISTS (SELECT 1 FROM agent_run_tenant_limits t
                    WHERE t.pool = p_pool AND t.tokens_per_minute IS NOT NULL)
      INTO default_limit, aging_s, v_paused, limited, v_rated
      FROM agent_run_pools p WHERE p.name = p_pool;
    IF NOT FOUND OR v_paused THEN
        RETURN;
    END IF;
    IF default_limit = 0 THEN
        SELECT coalesce(array_agg(t.tenant_id), '{}') INTO only_tenants
          FROM agent_run_tenant_limits t
         WHERE t.pool = p_pool AND t.max_in_flight > 0;
        IF cardinality(only_tenants) = 0 THEN
            RETURN;
        END IF;
    END IF;
    IF limited THEN
        SELECT coalesce(array_agg(x.tenant_id), '{}') INTO skip
          FROM (SELECT l.tenant_id
                  FROM (SELECT r.tenant_id, count(*) AS n
                          FROM agent_runs r
                         WHERE r.pool = p_pool AND r.status = 'leased'
                         GROUP BY r.tenant_id) l
                  LEFT JOIN agent_run_tenant_limits t
                    ON t.pool = p_pool AND t.tenant_id = l.tenant_id
                 WHERE l.n >= coalesce(t.max_in_flight, default_limit)
                UNION
                SELECT t.tenant_id FROM agent_run_tenant_limits t
                 WHERE t.pool = p_pool
                   AND coalesce(t.max_in_flight, default_limit) = 0) x;
    END IF;
    IF v_rated THEN
        -- Their runs wait, in every claimer alike, until the minute is under the rate.
        skip := skip || ARRAY(
            SELECT t.tenant_id FROM agent_run_tenant_limits t
             WHERE t.pool = p_pool AND t.tokens_per_minute IS NOT NULL
               AND (SELECT coalesce(sum(l.input_tokens + l.output_tokens), 0)
                      FROM agent_run_usage_log l
                     WHERE l.pool = p_pool AND l.tenant_id = t.tenant_id
                       AND l.created_at > p_now - interval '60 seconds')
                   >= t.tokens_per_minute);
    END IF;
    is_open := true;
END;
$$;


-- Stage promote: runs whose backoff is over become ready (a bounded batch
-- per claim; what is left over is promoted by the next claims). Returns how
-- many.
CREATE OR REPLACE FUNCTION runlease_claim_promote(p_pool text, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
AS $$
DECLARE
    v_due uuid[];
BEGIN
    SELECT array_agg(d.id) INTO v_due
      FROM (SELECT d.id FROM agent_runs d
             WHERE d.pool = p_pool AND d.status = 'pending' AND d.delayed
               AND d.available_at <= p_now
             ORDER BY d.available_at
             LIMIT 1000
               FOR UPDATE SKIP LOCKED) d;
    IF v_due IS NULL THEN
        RETURN 0;
    END IF;
    UPDATE agent_runs r SET delayed = false WHERE r.id = ANY (v_due);
    RETURN cardinality(v_due);
END;
$$;


-- Stage tenants: the tenants with ready runs (a loose index scan, one
-- descent each), less those in p_skip, and only those in p_only when given.
CREATE OR REPLACE FUNCTION runlease_claim_tenants(p_pool text, p_skip text[], p_only text[])
RETURNS text[]
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
AS $$
DECLARE
    v_tenants text[];
BEGIN
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
    SELECT coalesce(array_agg(t.tenant_id), '{}') INTO v_tenants
      FROM tenants t
     WHERE t.tenant_id IS NOT NULL
       AND t.tenant_id <> ALL (p_skip)
       AND (p_only IS NULL OR t.tenant_id = ANY (p_only));
    RETURN v_tenants;
END;
$$;


-- Stage places: the head of the pool's fair order among p_tenants, up to
-- p_n runs, each locked (FOR UPDATE SKIP LOCKED); ids and tenants in fair
-- order. Each round looks at a window of the merged order, `window` runs
-- (p_n, then 4 times more each round), none after a bound taken from the
-- tenants' lines (so a tenant whose line starts later is not read). Rows
-- another claimer holds are passed over; the next round looks past them
-- with a wider window.
CREATE OR REPLACE FUNCTION runlease_claim_places(
    p_pool text, p_n integer, p_tenants text[], p_now timestamptz,
    OUT ids uuid[], OUT tenants text[]
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
AS $$
DECLARE
    v_seen      uuid[] := '{}';
    v_cand      uuid[];
    v_got_ids   uuid[];
    v_got_tens  text[];
    v_got_fair  bigint[];
    v_fair      bigint[] := '{}';
    v_round     integer := 0;
    v_need      integer;
    v_window    integer := p_n;
    v_k         integer;
BEGIN
    ids := '{}';
    tenants := '{}';
    IF cardinality(p_tenants) = 0 OR p_n < 1 THEN
        RETURN;
    END IF;
    LOOP
        v_round := v_round + 1;
        v_need := p_n - cardinality(ids);
        IF v_round > 1 THEN
            v_window := v_window * 4;
        END IF;
        -- The bound: with k = ceil(window / tenants), the j-th smallest of
        -- the tenants' k-th runs, j = ceil(window / k): j tenants have k runs
        -- each at or before it, so the window's runs all are. Each tenant
        -- then gives about window / tenants runs, not a whole window.
        v_k := ceil(v_window::numeric / cardinality(p_tenants))::integer;
        -- One statement, so one snapshot: the window holds `window` runs
        -- whenever that many are there to find.
        WITH kth AS (
            SELECT h.fair_seq
              FROM unnest(p_tenants) AS t (tenant_id)
             CROSS JOIN LATERAL (
                    SELECT r.fair_seq FROM agent_runs r
                     WHERE r.pool = p_pool AND r.tenant_id = t.tenant_id
                       AND r.status = 'pending' AND NOT r.delayed
                       AND r.available_at <= p_now
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
                  FROM unnest(p_tenants) AS t (tenant_id)
                 CROSS JOIN LATERAL (
                        SELECT r.id, r.fair_seq FROM agent_runs r
                         WHERE r.pool = p_pool AND r.tenant_id = t.tenant_id
                           AND r.status = 'pending' AND NOT r.delayed
                           AND r.fair_seq <= (SELECT bound.fair_seq FROM bound)
                           AND r.available_at <= p_now
                           AND r.id <> ALL (v_seen)
                         ORDER BY r.fair_seq, r.id
                         LIMIT v_window
                       ) h
                 ORDER BY h.fair_seq, h.id
                 LIMIT v_window) c;
        EXIT WHEN v_cand IS NULL;
        SELECT array_agg(s.id), array_agg(s.tenant_id), array_agg(s.fair_seq)
          INTO v_got_ids, v_got_tens, v_got_fair
          FROM (SELECT r.id, r.tenant_id, r.fair_seq
                  FROM agent_runs r
                 WHERE r.id = ANY (v_cand)
                   -- Written so no partial index's predicate is implied: by
                   -- primary key, not a full scan of an index for the ids.
                   AND (r.status = 'pending' AND NOT r.delayed) IS TRUE
                   AND r.available_at <= p_now
                   AND r.cancel_requested_at IS NULL
                 ORDER BY r.fair_seq, r.id
                 LIMIT v_need
                   FOR UPDATE SKIP LOCKED) s;
        ids := ids || coalesce(v_got_ids, '{}');
        tenants := tenants || coalesce(v_got_tens, '{}');
        v_fair := v_fair || coalesce(v_got_fair, '{}');
        -- Done when full, when the window held everything there was, or
        -- after a few rounds (a claim that comes back short is repeated).
        EXIT WHEN cardinality(ids) >= p_n OR cardinality(v_cand) < v_window OR v_round >= 6;
        v_seen := v_seen || v_cand;
    END LOOP;
    IF v_round > 1 AND cardinality(ids) > 0 THEN
        -- Rounds after the first may have found runs ahead of earlier ones.
        SELECT array_agg(s.id ORDER BY s.f, s.id), array_agg(s.t ORDER BY s.f, s.id)
          INTO ids, tenants
          FROM unnest(ids, tenants, v_fair) AS s (id, t, f);
    END IF;
END;
$$;


-- Stage recount: how many of its places each tenant may use: all of them,
-- or what its cap leaves. With caps in the pool (p_limited), claimers
-- serialize per capped tenant on a transaction-level advisory lock, taken
-- for every capped tenant among the places in one global order (two
-- claimers never wait for each other in a cycle), and count that tenant's
-- leases in a statement that starts after the lock is held: its snapshot
-- sees every claim committed before, so never more than L are leased
-- however many workers claim at once. (A single statement cannot do this:
-- its snapshot predates any lock it takes; hence stages of their own.)
-- Tenants left with nothing to take are left out.
CREATE OR REPLACE FUNCTION runlease_claim_recount(
    p_pool text, p_place_tenants text[], p_limited boolean, p_default_limit integer,
    OUT tenants text[], OUT takes integer[]
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
AS $$
BEGIN
    IF p_limited THEN
        PERFORM pg_advisory_xact_lock(1381322316, k.key)
           FROM (SELECT DISTINCT hashtext(p_pool || '/' || c.tenant_id) AS key
                   FROM unnest(p_place_tenants) AS c (tenant_id)
                   LEFT JOIN agent_run_tenant_limits t
                     ON t.pool = p_pool AND t.tenant_id = c.tenant_id
                  WHERE coalesce(t.max_in_flight, p_default_limit) IS NOT NULL
                  ORDER BY 1) k;
    END IF;
    -- A new statement, so a new snapshot.
    SELECT coalesce(array_agg(k.tenant_id), '{}'), coalesce(array_agg(k.take), '{}')
      INTO tenants, takes
      FROM (SELECT d.tenant_id,
                   CASE WHEN p_limited
                             AND coalesce(t.max_in_flight, p_default_limit) IS NOT NULL
                        THEN least(d.places, coalesce(t.max_in_flight, p_default_limit)
                                   - (SELECT count(*) FROM agent_runs r
                                       WHERE r.pool = p_pool AND r.tenant_id = d.tenant_id
                                         AND r.status = 'leased'))
                        ELSE d.places END::integer AS take
              FROM (SELECT c.tenant_id, count(*) AS places
                      FROM unnest(p_place_tenants) AS c (tenant_id)
                     GROUP BY c.tenant_id) d
              LEFT JOIN agent_run_tenant_limits t
                ON t.pool = p_pool AND t.tenant_id = d.tenant_id) k
     WHERE k.take > 0;
END;
$$;


-- Stage fill: each tenant's own order fills its places. Its place holders
-- and its `take` highest-priority available runs (locked, SKIP LOCKED)
-- compete by effective priority; the best `take` are its picks, numbered k
-- in its own order (the k-th pick fills the tenant's k-th place).
CREATE OR REPLACE FUNCTION runlease_claim_fill(
    p_pool text, p_tenants text[], p_takes integer[], p_place_ids uuid[],
    p_aging_s integer, p_now timestamptz,
    OUT pick_ids uuid[], OUT pick_tenants text[], OUT pick_fair bigint[], OUT pick_k bigint[]
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
AS $$
BEGIN
    WITH takes AS (
        SELECT * FROM unnest(p_tenants, p_takes) AS k (tenant_id, take)
    ), own AS (
        SELECT r.id, r.tenant_id, r.priority, r.fair_seq, r.available_at
          FROM agent_runs r
         WHERE r.id = ANY (p_place_ids)
        UNION
        SELECT c.id, c.tenant_id, c.priority, c.fair_seq, c.available_at
          FROM takes k
         CROSS JOIN LATERAL (
                SELECT r.id, r.tenant_id, r.priority, r.fair_seq, r.available_at
                  FROM agent_runs r
                 WHERE r.pool = p_pool
                   AND r.tenant_id = k.tenant_id
                   AND r.status = 'pending' AND NOT r.delayed
                   AND r.available_at <= p_now
                   AND r.cancel_requested_at IS NULL
                 ORDER BY r.priority DESC, r.fair_seq, r.id
                 LIMIT k.take
                   FOR UPDATE SKIP LOCKED
               ) c
    ), ranked AS (
        SELECT o.id, o.tenant_id, o.fair_seq,
               row_number() OVER (
                   PARTITION BY o.tenant_id
                   ORDER BY o.priority + CASE WHEN p_aging_s > 0
                                              THEN extract(epoch FROM p_now - o.available_at)
                                                   / p_aging_s
                                              ELSE 0 END DESC,
                            o.priority DESC, o.fair_seq, o.id) AS k
          FROM own o
    )
    SELECT array_agg(r.id), array_agg(r.tenant_id), array_agg(r.fair_seq), array_agg(r.k)
      INTO pick_ids, pick_tenants, pick_fair, pick_k
      FROM ranked r
      JOIN takes USING (tenant_id)
     WHERE r.k <= takes.take;
END;
$$;


-- Stage threads (issue 27, invariant 11): a thread's runs other than its
-- head are parked out of the claim's indexes (see runlease_thread_advance),
-- so the places never hold them and this stage drops nothing in a sound
-- database. It is the claim's own check of the rule, on the picks only
-- (a primary-key read each, and one of agent_run_threads per pick in a
-- thread): a pick that is in a thread and is not its head is dropped. Behind
-- it, agent_runs_thread_active_idx (unique, leased runs per thread) refuses
-- a second lease outright.
CREATE OR REPLACE FUNCTION runlease_claim_threads(
    p_ids uuid[], p_tenants text[], p_fair bigint[], p_k bigint[],
    OUT pick_ids uuid[], OUT pick_tenants text[], OUT pick_fair bigint[], OUT pick_k bigint[]
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
AS $$
BEGIN
    SELECT array_agg(p.id), array_agg(p.tenant_id), array_agg(p.fair_seq), array_agg(p.k)
      INTO pick_ids, pick_tenants, pick_fair, pick_k
      FROM unnest(p_ids, p_tenants, p_fair, p_k) AS p (id, tenant_id, fair_seq, k)
     WHERE NOT EXISTS (
            SELECT 1 FROM agent_runs r
             WHERE r.id = p.id AND r.thread_id IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM agent_run_threads t
                                WHERE t.tenant_id = r.tenant_id AND t.thread_id = r.thread_id
                                  AND t.head_run_id = r.id));
END;
$$;


-- Stage lease: the picks become leased by p_worker, in the order of the
-- places they fill (nth). A place holder passed over takes the fair_seq of
-- the pick that used its place. Appends each run's holder (agent_runs.holders,
-- the console's attempts history, the last 16 claims) and the counts' delta
-- of the claim (the count trigger passes claims over: each leased run left
-- 'pending'; it was ready, not delayed, locked with that condition, so still so).
CREATE OR REPLACE FUNCTION runlease_claim_lease(
    p_pool text, p_worker text, p_place_ids uuid[], p_place_tenants text[],
    p_pick_ids uuid[], p_pick_tenants text[], p_pick_fair bigint[], p_pick_k bigint[],
    p_now timestamptz
) RETURNS TABLE (
    id uuid, pool text, tenant_id text, priority integer, attempts integer,
    max_attempts integer, lease_epoch bigint, cancel_requested_at timestamptz,
    input_json jsonb, budget_json jsonb, created_at timestamptz, available_at timestamptz,
    updated_at timestamptz, nth bigint, thread_id text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH places AS (
        SELECT s.id, s.tenant_id, s.ord,
               row_number() OVER (PARTITION BY s.tenant_id ORDER BY s.ord) AS k
          FROM unnest(p_place_ids, p_place_tenants) WITH ORDINALITY AS s (id, tenant_id, ord)
    ), picks AS (
        SELECT * FROM unnest(p_pick_ids, p_pick_tenants, p_pick_fair, p_pick_k)
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
           SET status = 'leased', locked_by = p_worker,
               attempts = r.attempts + 1, lease_epoch = r.lease_epoch + 1, updated_at = p_now,
               holders = (CASE WHEN jsonb_array_length(r.holders) >= 16 THEN r.holders - 0
                               ELSE r.holders END)
                         || jsonb_build_object('worker', p_worker, 'attempt', r.attempts + 1,
                                               'at', p_now, 'seq', r.event_seq)
          FROM chosen
         WHERE r.id = chosen.id
        RETURNING r.id, r.pool, r.tenant_id, r.priority, r.attempts, r.max_attempts,
                  r.lease_epoch, r.cancel_requested_at, r.input_json, r.budget_json,
                  r.created_at, r.available_at, r.updated_at, chosen.nth, r.thread_id
    ), counted AS (
        INSERT INTO agent_run_count_deltas (pool, tenant_id, state, error_code, n)
        SELECT c.pool, c.tenant_id, 'pending', '', -count(*)
          FROM claimed c
         GROUP BY c.pool, c.tenant_id
    )
    SELECT c.id, c.pool, c.tenant_id, c.priority, c.attempts, c.max_attempts,
           c.lease_epoch, c.cancel_requested_at, c.input_json, c.budget_json,
           c.created_at, c.available_at, c.updated_at, c.nth, c.thread_id
      FROM claimed c;
END;
$$;


-- The orchestrator. The worker incarnation p_worker must be live (its row
-- in agent_run_workers not ended and unexpired by the clock): a run's lease
-- is live while its holder's incarnation is, so a claim by an incarnation
-- that cannot renew would lease runs nobody runs. Raises SQLSTATE RLW01
-- (the store's IncarnationEnded) otherwise; the worker registers again.
-- Returns the leased runs, each with lease_until, the incarnation's expiry
-- now (the lease's, until its next renewal).
CREATE OR REPLACE FUNCTION runlease_claim(
    p_pool text, p_worker text, p_n integer, p_now timestamptz
) RETURNS TABLE (
    id uuid, pool text, tenant_id text, priority integer, attempts integer,
    max_attempts integer, lease_epoch bigint, lease_until timestamptz,
    cancel_requested_at timestamptz, input_json jsonb, budget_json jsonb,
    created_at timestamptz, available_at timestamptz, updated_at timestamptz, nth bigint,
    thread_id text
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := coalesce(p_now, now());
    v_until  timestamptz;
    v_terms  record;
    v_places record;
    v_counts record;
    v_picks  record;
BEGIN
    SELECT w.expires_at INTO v_until
      FROM agent_run_workers w
     WHERE w.id = p_worker AND w.ended_at IS NULL AND w.expires_at > v_now;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'worker incarnation % is not live: register it again', p_worker
              USING ERRCODE = 'RLW01';
    END IF;
    IF p_n < 1 THEN
        RETURN;
    END IF;
    v_terms := runlease_claim_admit(p_pool, v_now);
    IF NOT v_terms.is_open THEN
        RETURN;
    END IF;
    PERFORM runlease_claim_promote(p_pool, v_now);
    v_places := runlease_claim_places(
        p_pool, p_n, runlease_claim_tenants(p_pool, v_terms.skip, v_terms.only_tenants), v_now);
    IF cardinality(v_places.ids) = 0 THEN
        RETURN;
    END IF;
    v_counts := runlease_claim_recount(p_pool, v_places.tenants, v_terms.limited,
                                       v_terms.default_limit);
    IF cardinality(v_counts.tenants) = 0 THEN
        RETURN;
    END IF;
    v_picks := runlease_claim_fill(p_pool, v_counts.tenants, v_counts.takes, v_places.ids,
                                   v_terms.aging_s, v_now);
    v_picks := runlease_claim_threads(v_picks.pick_ids, v_picks.pick_tenants,
                                      v_picks.pick_fair, v_picks.pick_k);
    RETURN QUERY
    SELECT l.id, l.pool, l.tenant_id, l.priority, l.attempts, l.max_attempts, l.lease_epoch,
           v_until, l.cancel_requested_at, l.input_json, l.budget_json, l.created_at,
           l.available_at, l.updated_at, l.nth, l.thread_id
      FROM runlease_claim_lease(p_pool, p_worker, v_places.ids, v_places.tenants,
                                v_picks.pick_ids, v_picks.pick_tenants, v_picks.pick_fair, v_picks.pick_k,
                                v_now) l;
END;
$$;


-- Threads (issue 27, migration 0017): a thread's head is the one run of it
-- that may be claimed or is active; its other unfinished runs are parked
-- (delayed, available_at far ahead, thread_due_at the time they were due).
-- When the head finishes (done, dead, cancelled: finished_at set), the next
-- parked run by thread_seq becomes the head, due at max(its own due time,
-- the finish), and the claim's promotion makes it ready. A run that comes
-- back from a final state (redrive) rejoins its thread: the head if the
-- thread is idle, parked otherwise. A parked run that finishes (a cancel)
-- moves nothing. Serialized with the thread's submits on its row of
-- agent_run_threads. The clock is the finishing statement's (finished_at,
-- or updated_at for a redrive), so a test's injected time holds here too.
-- Fires only for runs in a thread whose finished state changed; everything
-- else (heartbeats, usage, every run in no thread) is passed over by the
-- trigger's column list or its WHEN.
CREATE OR REPLACE FUNCTION runlease_thread_advance() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_ts   timestamptz := coalesce(NEW.finished_at, NEW.updated_at, now());
    v_head uuid;
    v_next record;
BEGIN
    IF NEW.finished_at IS NULL THEN
        SELECT t.head_run_id INTO v_head FROM agent_run_threads t
         WHERE t.tenant_id = NEW.tenant_id AND t.thread_id = NEW.thread_id
           FOR UPDATE;
        IF v_head IS NULL THEN
            UPDATE agent_run_threads t SET head_run_id = NEW.id, updated_at = v_ts
             WHERE t.tenant_id = NEW.tenant_id AND t.thread_id = NEW.thread_id;
        ELSIF v_head <> NEW.id THEN
            UPDATE agent_runs r
               SET delayed = true, thread_due_at = r.available_at,
                   available_at = '9999-01-01 00:00:00+00'::timestamptz
             WHERE r.id = NEW.id AND r.status = 'pending';
        END IF;
        RETURN NULL;
    END IF;
    UPDATE agent_run_threads t SET head_run_id = NULL, updated_at = v_ts
     WHERE t.tenant_id = NEW.tenant_id AND t.thread_id = NEW.thread_id
       AND t.head_run_id = NEW.id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT r.id, r.pool, greatest(r.thread_due_at, v_ts) AS due INTO v_next
      FROM agent_runs r
     WHERE r.tenant_id = NEW.tenant_id AND r.thread_id = NEW.thread_id
       AND r.thread_due_at IS NOT NULL AND r.status = 'pending'
     ORDER BY r.thread_seq
     LIMIT 1
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE agent_runs r SET available_at = v_next.due, thread_due_at = NULL
     WHERE r.id = v_next.id;
    UPDATE agent_run_threads t SET head_run_id = v_next.id
     WHERE t.tenant_id = NEW.tenant_id AND t.thread_id = NEW.thread_id;
    IF v_next.due <= v_ts THEN
        -- The pool's claimers (db/channels.py, POOL_CHANNEL_PREFIX).
        PERFORM pg_notify('runlease_pool_' || v_next.pool, v_next.pool);
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER agent_runs_thread_advance
    AFTER UPDATE OF status ON agent_runs
    FOR EACH ROW
    WHEN (NEW.thread_id IS NOT NULL
          AND (OLD.finished_at IS NULL) <> (NEW.finished_at IS NULL))
    EXECUTE FUNCTION runlease_thread_advance();


-- Concurrency keys (issue 27, migration 0017): a pool's limit for a key:
-- its own row, else the longest pattern it matches (`*` any characters;
-- migration 0021; ties by the pattern's text), else the pool's default '*',
-- else NULL: unlimited. The patterns are read from the pool's rows (at most
-- 1,000), at a submit or a finish of a keyed run, never by a claim.
CREATE OR REPLACE FUNCTION runlease_key_limit(p_pool text, p_key text) RETURNS integer
LANGUAGE sql STABLE
RETURN coalesce((SELECT l.max_in_flight FROM agent_run_key_limits l
                  WHERE l.pool = p_pool AND l.key = p_key),
                (SELECT l.max_in_flight FROM agent_run_key_limits l
                  WHERE l.pool = p_pool AND l.key <> '*' AND strpos(l.key, '*') > 0
                    AND p_key LIKE replace(replace(l.key, '_', '\_'), '*', '%')
                  ORDER BY length(l.key) DESC, l.key
                  LIMIT 1),
                (SELECT l.max_in_flight FROM agent_run_key_limits l
                  WHERE l.pool = p_pool AND l.key = '*'));

-- A run just inserted (same transaction) joins its key: it takes a slot
-- when the key is under its limit, and is parked otherwise (out of every
-- claim path until a slot is handed to it). Under the key's row lock, so
-- `active` (the runs holding a slot) never passes the limit. Returns
-- whether the run was parked.
CREATE OR REPLACE FUNCTION runlease_key_join(p_run uuid, p_key text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_run    record;
    v_active integer;
    v_limit  integer;
BEGIN
    UPDATE agent_runs r SET concurrency_key = p_key
     WHERE r.id = p_run AND r.status = 'pending' AND r.concurrency_key IS NULL
    RETURNING r.pool, r.tenant_id INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO agent_run_keys (pool, tenant_id, key) VALUES (v_run.pool, v_run.tenant_id, p_key)
        ON CONFLICT DO NOTHING;
    SELECT k.active INTO v_active FROM agent_run_keys k
     WHERE k.pool = v_run.pool AND k.tenant_id = v_run.tenant_id AND k.key = p_key
       FOR UPDATE;
    v_limit := runlease_key_limit(v_run.pool, p_key);
    IF v_limit IS NULL OR v_active < v_limit THEN
        UPDATE agent_run_keys k SET active = k.active + 1
         WHERE k.pool = v_run.pool AND k.tenant_id = v_run.tenant_id AND k.key = p_key;
        RETURN false;
    END IF;
    UPDATE agent_runs r
       SET delayed = true, key_due_at = r.available_at,
           available_at = '9999-01-01 00:00:00+00'::timestamptz
     WHERE r.id = p_run;
    UPDATE agent_run_keys k SET waiting = k.waiting + 1
     WHERE k.pool = v_run.pool AND k.tenant_id = v_run.tenant_id AND k.key = p_key;
    RETURN true;
END;
$$;

-- A run of a key that held a slot finishes (done, dead, cancelled): the
-- slot goes to the key's oldest parked run while the key is within its
-- limit (due at max(its own due time, the finish)), else it is freed. A
-- parked run that finishes (a cancel) held none. A run back from a final
-- state (redrive) takes a slot again, or is parked. A run that waits for a
-- person (issue 28) holds no slot either: going to `waiting` frees it as a
-- finish does, and the resume takes one again, or parks the run, as a
-- redrive does. As runlease_thread_advance.
CREATE OR REPLACE FUNCTION runlease_key_release() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_ts     timestamptz := coalesce(NEW.finished_at, NEW.updated_at, now());
    v_active integer;
    v_limit  integer;
    v_next   record;
BEGIN
    IF NEW.finished_at IS NOT NULL AND OLD.key_due_at IS NOT NULL THEN
        -- A parked run finished (a cancel): it held no slot; one less waits.
        UPDATE agent_run_keys k SET waiting = greatest(k.waiting - 1, 0)
         WHERE k.pool = NEW.pool AND k.tenant_id = NEW.tenant_id
           AND k.key = NEW.concurrency_key;
        RETURN NULL;
    END IF;
    INSERT INTO agent_run_keys (pool, tenant_id, key)
    VALUES (NEW.pool, NEW.tenant_id, NEW.concurrency_key)
        ON CONFLICT DO NOTHING;
    SELECT k.active INTO v_active FROM agent_run_keys k
     WHERE k.pool = NEW.pool AND k.tenant_id = NEW.tenant_id AND k.key = NEW.concurrency_key
       FOR UPDATE;
    v_limit := runlease_key_limit(NEW.pool, NEW.concurrency_key);
    IF NEW.finished_at IS NULL AND NEW.status <> 'waiting' THEN
        IF v_limit IS NULL OR v_active < v_limit THEN
            UPDATE agent_run_keys k SET active = k.active + 1
             WHERE k.pool = NEW.pool AND k.tenant_id = NEW.tenant_id
               AND k.key = NEW.concurrency_key;
        ELSE
            UPDATE agent_runs r
               SET delayed = true, key_due_at = r.available_at,
                   available_at = '9999-01-01 00:00:00+00'::timestamptz
             WHERE r.id = NEW.id AND r.status = 'pending';
            IF FOUND THEN
                UPDATE agent_run_keys k SET waiting = k.waiting + 1
                 WHERE k.pool = NEW.pool AND k.tenant_id = NEW.tenant_id
                   AND k.key = NEW.concurrency_key;
            END IF;
        END IF;
        RETURN NULL;
    END IF;
    IF v_limit IS NULL OR v_active <= v_limit THEN
        SELECT r.id, r.pool, greatest(r.key_due_at, v_ts) AS due INTO v_next
          FROM agent_runs r
         WHERE r.pool = NEW.pool AND r.tenant_id = NEW.tenant_id
           AND r.concurrency_key = NEW.concurrency_key
           AND r.key_due_at IS NOT NULL AND r.status = 'pending'
         ORDER BY r.id
         LIMIT 1
           FOR UPDATE;
        IF FOUND THEN
            UPDATE agent_runs r SET available_at = v_next.due, key_due_at = NULL
             WHERE r.id = v_next.id;
            UPDATE agent_run_keys k SET waiting = greatest(k.waiting - 1, 0)
             WHERE k.pool = NEW.pool AND k.tenant_id = NEW.tenant_id
               AND k.key = NEW.concurrency_key;
            IF v_next.due <= v_ts THEN
                PERFORM pg_notify('runlease_pool_' || v_next.pool, v_next.pool);
            END IF;
            RETURN NULL;  -- the slot passed over: active unchanged
        END IF;
    END IF;
    UPDATE agent_run_keys k SET active = greatest(k.active - 1, 0)
     WHERE k.pool = NEW.pool AND k.tenant_id = NEW.tenant_id AND k.key = NEW.concurrency_key;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER agent_runs_key_release
    AFTER UPDATE OF status ON agent_runs
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL
          AND (OLD.finished_at IS NULL AND OLD.status <> 'waiting')
              <> (NEW.finished_at IS NULL AND NEW.status <> 'waiting'))
    EXECUTE FUNCTION runlease_key_release();

-- A pool's key limits were raised (or removed): its keys with parked runs
-- and free slots hand them out now, a bounded batch of keys per call (the
-- keys found by a loose index scan of agent_runs_key_parked_idx). Returns
-- how many runs it unparked.
CREATE OR REPLACE FUNCTION runlease_key_refill(p_pool text, p_batch integer, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_key    record;
    v_active integer;
    v_limit  integer;
    v_moved  integer := 0;
    v_n      integer;
BEGIN
    FOR v_key IN
        WITH RECURSIVE keys AS (
            (SELECT r.tenant_id, r.concurrency_key FROM agent_runs r
              WHERE r.pool = p_pool AND r.key_due_at IS NOT NULL AND r.status = 'pending'
              ORDER BY r.tenant_id, r.concurrency_key LIMIT 1)
            UNION ALL
            SELECT n.tenant_id, n.concurrency_key
              FROM keys k
             CROSS JOIN LATERAL (
                    SELECT r.tenant_id, r.concurrency_key FROM agent_runs r
                     WHERE r.pool = p_pool AND r.key_due_at IS NOT NULL AND r.status = 'pending'
                       AND (r.tenant_id, r.concurrency_key) > (k.tenant_id, k.concurrency_key)
                     ORDER BY r.tenant_id, r.concurrency_key LIMIT 1) n
        )
        SELECT * FROM keys LIMIT p_batch
    LOOP
        SELECT k.active INTO v_active FROM agent_run_keys k
         WHERE k.pool = p_pool AND k.tenant_id = v_key.tenant_id AND k.key = v_key.concurrency_key
           FOR UPDATE;
        v_limit := runlease_key_limit(p_pool, v_key.concurrency_key);
        WITH next AS (
            SELECT r.id FROM agent_runs r
             WHERE r.pool = p_pool AND r.tenant_id = v_key.tenant_id
               AND r.concurrency_key = v_key.concurrency_key
               AND r.key_due_at IS NOT NULL AND r.status = 'pending'
             ORDER BY r.id
             LIMIT CASE WHEN v_limit IS NULL THEN NULL
                        ELSE greatest(v_limit - coalesce(v_active, 0), 0) END
               FOR UPDATE
        ), moved AS (
            UPDATE agent_runs r
               SET available_at = greatest(r.key_due_at, coalesce(p_now, now())), key_due_at = NULL
              FROM next WHERE r.id = next.id
            RETURNING r.id
        )
        SELECT count(*) INTO v_n FROM moved;
        UPDATE agent_run_keys k SET active = k.active + v_n,
                                    waiting = greatest(k.waiting - v_n, 0)
         WHERE k.pool = p_pool AND k.tenant_id = v_key.tenant_id AND k.key = v_key.concurrency_key;
        v_moved := v_moved + v_n;
    END LOOP;
    IF v_moved > 0 THEN
        PERFORM pg_notify('runlease_pool_' || p_pool, p_pool);
    END IF;
    RETURN v_moved;
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
