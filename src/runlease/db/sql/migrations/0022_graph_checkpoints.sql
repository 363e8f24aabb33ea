-- 0022: LangGraph checkpoints (issue 30), written by runlease's checkpoint
-- saver (runlease.integrations.langgraph) for the run that holds the lease.
--
-- A checkpoint belongs to a graph thread of a tenant, its thread_key:
-- 'run:<the run's id>', or 'thread:<id>' of the runlease thread the run
-- belongs to (so a conversation continues across the thread's runs). Each row also names the run that wrote it, and goes
-- with that run (retention's cascade). A checkpoint holds its channel values
-- whole (no blobs shared between checkpoints), so deleting an old run's
-- checkpoints never takes a value that a newer checkpoint still reads.
-- Every write is fenced by the writer's lease, in its own statement
-- (sql/checkpoints.sql): a stale attempt never writes a checkpoint.
CREATE TABLE agent_run_graph_checkpoints (
    tenant_id     text        NOT NULL,
    thread_key    text        NOT NULL CHECK (length(thread_key) BETWEEN 1 AND 160),
    checkpoint_ns text        NOT NULL CHECK (length(checkpoint_ns) <= 512),
    checkpoint_id text        NOT NULL CHECK (length(checkpoint_id) BETWEEN 1 AND 64),
    parent_id     text        CHECK (length(parent_id) BETWEEN 1 AND 64),
    run_id        uuid        NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    lease_epoch   bigint      NOT NULL,
    type          text        NOT NULL CHECK (length(type) BETWEEN 1 AND 32),
    checkpoint    bytea       NOT NULL CHECK (octet_length(checkpoint) <= 4194304),
    metadata      jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, thread_key, checkpoint_ns, checkpoint_id)
);

-- A run's own checkpoints: the cascade, and the pruning each write does
-- (a run keeps its newest few per thread and namespace).
CREATE INDEX agent_run_graph_checkpoints_run_idx
    ON agent_run_graph_checkpoints (run_id, thread_key, checkpoint_ns, checkpoint_id);

-- What the tasks of a step wrote before the step's checkpoint (put_writes):
-- a task that finished is not run again when the step is resumed.
CREATE TABLE agent_run_graph_writes (
    tenant_id     text        NOT NULL,
    thread_key    text        NOT NULL CHECK (length(thread_key) BETWEEN 1 AND 160),
    checkpoint_ns text        NOT NULL CHECK (length(checkpoint_ns) <= 512),
    checkpoint_id text        NOT NULL CHECK (length(checkpoint_id) BETWEEN 1 AND 64),
    task_id       text        NOT NULL CHECK (length(task_id) BETWEEN 1 AND 128),
    idx           integer     NOT NULL,
    channel       text        NOT NULL CHECK (length(channel) BETWEEN 1 AND 256),
    type          text        NOT NULL CHECK (length(type) BETWEEN 1 AND 32),
    value         bytea       NOT NULL CHECK (octet_length(value) <= 4194304),
    task_path     text        NOT NULL CHECK (length(task_path) <= 1024),
    run_id        uuid        NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    lease_epoch   bigint      NOT NULL,
    PRIMARY KEY (tenant_id, thread_key, checkpoint_ns, checkpoint_id, task_id, idx)
);

CREATE INDEX agent_run_graph_writes_run_idx ON agent_run_graph_writes (run_id);
