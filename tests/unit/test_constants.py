"""Constants said once in Python, and again in the CRD and the schema (in their
own languages): the copies must agree with the source. The schema's are read
from a migrated database's catalog, which is what the migrations made."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from runlease.core import bounds, defaults
from runlease.core.states import RunStatus

ROOT = Path(__file__).resolve().parents[2]


def crd_spec() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "agentrunpools.runlease.dev.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]  # type: ignore[no-any-return]


def checks(url: str, table_name: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'c' ORDER BY conname",
            (table_name,)).fetchall()
    return [r[0] for r in rows]


def column_default(url: str, table_name: str, column: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT column_default FROM information_schema.columns"
            " WHERE table_name = %s AND column_name = %s AND is_nullable = 'NO'",
            (table_name, column)).fetchone()
    assert row, (table_name, column)
    return str(row[0])


def test_the_pool_name_pattern_is_the_crd_and_schema_check(db_url: str) -> None:
    assert crd_spec()["pool"]["pattern"] == bounds.POOL_PATTERN
    values = json.loads((ROOT / "charts" / "runlease" / "values.schema.json").read_text())
    assert values["properties"]["samplePool"]["properties"]["name"]["pattern"] \
        == bounds.POOL_PATTERN
    assert f"CHECK ((name ~ '{bounds.POOL_PATTERN}'::text))" in checks(db_url, "agent_run_pools")


def test_the_pool_name_pattern_allows_exactly_pool_max_chars() -> None:
    longest = "a" * bounds.POOL_MAX_CHARS
    assert re.match(bounds.POOL_PATTERN, longest)
    assert not re.match(bounds.POOL_PATTERN, longest + "a")
    assert bounds.check_pool(longest) == longest


@pytest.mark.parametrize(("crd_path", "column", "value"), [
    ("maxAttempts", "max_attempts", defaults.DEFAULT_MAX_ATTEMPTS),
    ("lease.durationSeconds", "lease_s", defaults.DEFAULT_LEASE_S),
    ("priorityAgingSeconds", "priority_aging_s", defaults.DEFAULT_PRIORITY_AGING_S),
    ("retentionSeconds", "retention_s", defaults.DEFAULT_RETENTION_S),
])
def test_pool_defaults_are_the_crd_and_schema_defaults(db_url: str, crd_path: str, column: str,
                                                       value: int) -> None:
    prop: dict[str, Any] = {"properties": crd_spec()}
    for part in crd_path.split("."):
        prop = prop["properties"][part]
    assert prop["default"] == value
    assert column_default(db_url, "agent_run_pools", column) == str(value)


def test_a_runs_default_max_attempts_is_the_pools(db_url: str) -> None:
    assert column_default(db_url, "agent_runs", "max_attempts") \
        == str(defaults.DEFAULT_MAX_ATTEMPTS)


def test_run_statuses_are_the_schema_check_and_the_api_literal(db_url: str) -> None:
    from runlease.api.schemas import Status

    (check,) = [c for c in checks(db_url, "agent_runs") if c.startswith("CHECK ((status = ANY")]
    in_sql = re.findall(r"'([a-z]+)'::text", check)
    assert in_sql == [s.value for s in RunStatus]
    assert list(typing.get_args(Status)) == [s.value for s in RunStatus]
