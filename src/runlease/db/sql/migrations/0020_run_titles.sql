-- 0020: a run's title (issue 29): a short summary given at submit, which the
-- console's runs list shows (else the first words of the input). Bounded
-- here as in core/bounds.check_title; redacted before it is stored, like
-- error messages and events. No index: it is shown, not searched.
ALTER TABLE agent_runs
    ADD COLUMN title text,
    ADD CONSTRAINT agent_runs_title_bounded
        CHECK (length(title) BETWEEN 1 AND 200 AND title !~ '[\x01-\x1f\x7f]');
