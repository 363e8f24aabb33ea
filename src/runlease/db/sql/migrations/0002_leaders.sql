-- 0002: leader election for the reaper (runlease_leaders).
CREATE TABLE runlease_leaders (
    name       text        PRIMARY KEY,
    leader_id  text        NOT NULL,
    term       bigint      NOT NULL CHECK (term > 0),
    elected_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
