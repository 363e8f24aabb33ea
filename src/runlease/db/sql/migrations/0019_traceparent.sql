-- 0019: the trace context a run was submitted with (issue 29). The API stores
-- the W3C traceparent of its submit span (or the caller's header, validated;
-- a malformed one is dropped, never refused); every attempt's spans, on
-- whichever worker, are children of it, so a reclaimed run stays one trace.
-- NULL: the run was submitted untraced. Nullable without a default: adding
-- it rewrites no row.
ALTER TABLE agent_runs
    ADD COLUMN traceparent text,
    ADD CONSTRAINT agent_runs_traceparent_w3c
        CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
