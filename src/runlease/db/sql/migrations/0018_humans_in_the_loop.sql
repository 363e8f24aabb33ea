-- 0018: humans in the loop and messages into a running run (issue 28).
--
-- A run that asks a person for input leaves its lease and its tenant's slot
-- and waits in a status of its own, `waiting` (ARCHITECTURE invariant 12):
-- no claim, heartbeat or reap reads it (each of their indexes names another
-- status), it is never charged an attempt for the wait, and the answer is
-- written as the wait step's committed result in the transaction that makes
-- the run pending again, so it is applied once. A waiting run stays its
-- thread's head (the thread advances only when a run finishes), so a thread
-- has one active run, leased or waiting (invariant 11).
LOCK TABLE agent_runs IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE agent_runs DROP CONSTRAINT agent_runs_status_check;
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_status_check
    CHECK (status IN ('pending', 'leased', 'waiting', 'done', 'dead', 'cancelled'));

-- The inbox (messages into a running run): inbox_seq numbers the run's
-- messages (the last one handed out), inbox_read is how many the agent has
-- taken, each as a durable step ('message:<seq>') written with it, so a
-- message is handed over once per run across attempts. Never indexed: a
-- message or a take stays a HOT update.
-- rerun_of: the run this one reruns (POST /v1/runs/{id}/rerun).
ALTER TABLE agent_runs
    ADD COLUMN inbox_seq  bigint NOT NULL DEFAULT 0,
    ADD COLUMN inbox_read bigint NOT NULL DEFAULT 0,
    ADD COLUMN rerun_of   uuid,
    ADD CONSTRAINT agent_runs_inbox_read_bounded CHECK (inbox_read BETWEEN 0 AND inbox_seq);

-- Invariant 11's last line of defence grows with the new status: a thread
-- cannot store two runs that are leased, or one leased and one waiting.
DROP INDEX agent_runs_thread_active_idx;
CREATE UNIQUE INDEX agent_runs_thread_active_idx
    ON agent_runs (tenant_id, thread_id)
    WHERE thread_id IS NOT NULL AND status IN ('leased', 'waiting');

-- Waiting runs, by pool (the runs list's status filter, the console, stats).
CREATE INDEX agent_runs_waiting_idx ON agent_runs (pool, tenant_id, id)
    WHERE status = 'waiting';

-- What a run asked a person, one row per (run, name), kept after it is
-- answered: the answer's value (applied once: a second, different answer is
-- refused), its outcome ('answered', 'timed_out', or 'closed' when the run
-- ended first), and the nonce that the signed resume URL names, so a URL
-- works once and for this request only.
CREATE TABLE agent_run_inputs (
    run_id       uuid        NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    name         text        NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    prompt       text        CHECK (length(prompt) <= 8192),
    schema       jsonb,
    requested_at timestamptz NOT NULL,
    timeout_at   timestamptz,
    nonce        text        NOT NULL CHECK (length(nonce) BETWEEN 16 AND 64),
    answered_at  timestamptz,
    outcome      text        CHECK (outcome IN ('answered', 'timed_out', 'closed')),
    value        jsonb,
    answered_by  text        CHECK (answered_by IN ('api', 'url', 'message', 'console', 'timeout',
                                                     'end')),
    PRIMARY KEY (run_id, name),
    CONSTRAINT agent_run_inputs_outcome_iff_answered
        CHECK ((answered_at IS NULL) = (outcome IS NULL))
);

-- The reaper's timeouts: only unanswered requests that can time out, by due
-- time, so the pass reads the due ones and nothing else.
CREATE INDEX agent_run_inputs_due_idx ON agent_run_inputs (timeout_at)
    WHERE answered_at IS NULL AND timeout_at IS NOT NULL;

-- A run's inbox: seq from agent_runs.inbox_seq, body redacted before it is
-- stored ({"text": ..., "data": ...}).
CREATE TABLE agent_run_messages (
    run_id     uuid        NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    seq        bigint      NOT NULL CHECK (seq >= 1),
    body       jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);

-- Reruns of a run (its page links them).
CREATE INDEX agent_runs_rerun_of_idx ON agent_runs (rerun_of) WHERE rerun_of IS NOT NULL;

-- Waiting runs are counted (done runs are the total less the rest).
ALTER TABLE agent_run_counts DROP CONSTRAINT agent_run_counts_state_check;
ALTER TABLE agent_run_counts ADD CONSTRAINT agent_run_counts_state_check
    CHECK (state IN ('pending', 'delayed', 'waiting', 'dead', 'cancelled', 'total'));

-- Secrets the server keeps for itself (the resume URLs' signing key when no
-- resume secret is configured): made once by whichever process needs one
-- first, the same for every replica, kept across restarts.
CREATE TABLE runlease_server_keys (
    name       text        PRIMARY KEY,
    secret     text        NOT NULL CHECK (length(secret) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);
