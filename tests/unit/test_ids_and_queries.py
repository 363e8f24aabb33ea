from __future__ import annotations

import pytest

from runlease.core.ids import uuid7
from runlease.db import queries
from runlease.db.queries import fill, parse, sql, statements


def test_uuid7_is_version_7_and_strictly_increasing() -> None:
    ids = [uuid7() for _ in range(10_000)]
    assert all(u.version == 7 and u.variant == "specified in RFC 4122" for u in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_every_statement_is_named_and_loaded_once() -> None:
    names = set(statements())
    for expected in ("run_enqueue", "run_claim", "worker_heartbeat", "run_ack", "run_nack",
                     "run_fail", "run_release", "run_request_cancel", "run_finalize_cancel",
                     "run_reap", "run_redrive", "run_get", "run_list", "run_event_record",
                     "run_step_record", "run_steps_get", "pool_upsert"):
        assert expected in names
    assert queries.sql("run_get").startswith("SELECT")


def test_parse_rejects_duplicates_and_empty_statements() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n", "x.sql")
    with pytest.raises(ValueError, match="empty"):
        parse("-- name: a\n\n-- name: b\nSELECT 2;\n", "x.sql")
    assert parse("-- comment\n-- name: a\nSELECT 1;\n", "x.sql") == {"a": "SELECT 1"}


def test_a_part_is_filled_into_the_statements_that_use_it() -> None:
    assert fill("SELECT 1 WHERE {{p}}", {"p": "x = 1"}, "a") == "SELECT 1 WHERE x = 1"
    assert fill("SELECT '{}'::jsonb", {}, "a") == "SELECT '{}'::jsonb"
    with pytest.raises(ValueError, match="unknown part 'q'"):
        fill("SELECT 1 WHERE {{q}}", {"p": "x = 1"}, "a")
    assert parse("-- part: p\nx = 1\n-- name: a\nSELECT {{p}};\n", "x.sql") == {
        "a": "SELECT {{p}}"}


def test_every_single_run_worker_write_carries_the_whole_lease_fence() -> None:
    # The fence is written once (parts.sql); each fenced statement must
    # still say all of it in its own WHERE, filled in, nothing left to fill.
    for name in ("run_nack", "run_fail", "run_finalize_cancel", "run_wait_children",
                 "run_usage_record", "run_step_record", "run_event_record",
                 "run_fence_share"):
        text = " ".join(sql(name).split())
        assert "{{" not in text, name
        assert ("WHERE r.id = %(id)s AND r.lease_epoch = %(epoch)s"
                " AND r.locked_by = %(worker)s AND (r.status = 'leased') IS TRUE"
                " AND EXISTS (SELECT 1 FROM agent_run_workers w WHERE w.id = %(worker)s"
                " AND w.ended_at IS NULL"
                " AND w.expires_at > coalesce(%(now)s::timestamptz, now()))") in text, name
