-- 0012: a heartbeat's cost flat in the leases it renews (issue 16, target 2).
--
-- fillfactor 50: a worker's leases were enqueued and claimed together, so
-- they fill whole pages, and one heartbeat statement renews every row of
-- those pages. A renewal stays on its page (HOT: no index entry) only if the
-- page has room for a second version of each of its rows; with 70, about a
-- third of a first heartbeat's renewals moved to other pages and wrote three
-- index entries each. Applies to pages written from now on. (The other
-- options are set again so that they stay in schema.sql's order.)
ALTER TABLE agent_runs SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- Every UPDATE re-checks every CHECK constraint, and jsonb_typeof detoasts
-- the whole input (a conversation, often compressed or out of line) at each
-- heartbeat. The same rule, checked only when the value is written.
ALTER TABLE agent_runs
    DROP CONSTRAINT agent_runs_input_is_object,
    DROP CONSTRAINT agent_runs_budget_is_object;

CREATE FUNCTION runlease_refuse_non_object() RETURNS trigger
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

CREATE TRIGGER agent_runs_objects_check_insert BEFORE INSERT ON agent_runs
    FOR EACH ROW
    WHEN (jsonb_typeof(NEW.input_json) <> 'object' OR jsonb_typeof(NEW.budget_json) <> 'object')
    EXECUTE FUNCTION runlease_refuse_non_object();

-- AFTER, not BEFORE: a BEFORE UPDATE trigger, even one for other columns,
-- locks and re-reads every updated row before looking at its column list.
CREATE TRIGGER agent_runs_objects_check_update
    AFTER UPDATE OF input_json, budget_json ON agent_runs
    FOR EACH ROW
    WHEN (jsonb_typeof(NEW.input_json) <> 'object' OR jsonb_typeof(NEW.budget_json) <> 'object')
    EXECUTE FUNCTION runlease_refuse_non_object();

-- The counts' update trigger fires only for an update that sets a column a
-- count depends on: a heartbeat (or a usage write) is passed over by the
-- column list alone, without reading the row for the WHEN.
DROP TRIGGER agent_runs_count_update ON agent_runs;

CREATE TRIGGER agent_runs_count_update
    AFTER UPDATE OF status, delayed, error_code, pool, tenant_id ON agent_runs
    FOR EACH ROW
    WHEN (runlease_counted_state(OLD.status, OLD.delayed)
              IS DISTINCT FROM runlease_counted_state(NEW.status, NEW.delayed)
          OR (NEW.status = 'dead' AND OLD.error_code IS DISTINCT FROM NEW.error_code)
          OR OLD.pool IS DISTINCT FROM NEW.pool
          OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id)
    EXECUTE FUNCTION runlease_count_change();
