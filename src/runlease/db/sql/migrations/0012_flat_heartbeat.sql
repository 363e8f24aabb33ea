-- 0012: a heartbeat's cost flat in the leases it renews (issue 16, target 2).
--
-- fillfactor 50: a worker's leases were enqueued and claimed together, so
-- they fill whole pages, and one heartbeat statement renews every row of
-- those pages. A renewal stays on its page (HOT: no index entry) only if the
-- page has room for a second version of each of its rows; with 70, about a
-- third of a first heartbeat's renewals moved to other pages and wrote three
-- index entries each. Applies to pages written from now on.
ALTER TABLE agent_runs SET (fillfactor = 50);

-- Every UPDATE re-checks every CHECK constraint, and jsonb_typeof detoasts
-- the whole input (a conversation, often compressed or out of line) at each
-- heartbeat. The same rule, checked only when the value is written: the
-- trigger agent_runs_objects_check (functions.sql), made in the same
-- transaction as this migration.
ALTER TABLE agent_runs
    DROP CONSTRAINT agent_runs_input_is_object,
    DROP CONSTRAINT agent_runs_budget_is_object;
