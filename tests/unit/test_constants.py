"""Constants said once in Python, and again in the CRD and schema.sql (in their
own languages): the copies must agree with the source."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from runlease.core import bounds, defaults
from runlease.core.states import RunStatus

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = (ROOT / "src" / "runlease" / "db" / "sql" / "schema.sql").read_text()


def crd_spec() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "agentrunpools.runlease.dev.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]  # type: ignore[no-any-return]


def table(name: str) -> str:
    match = re.search(rf"CREATE TABLE {name} \((.*?)\n\);", SCHEMA, re.DOTALL)
    assert match, name
    return match.group(1)


def column_default(table_name: str, column: str) -> str:
    match = re.search(rf"^\s*{column}\s+\w+\s+NOT NULL DEFAULT (\S+)", table(table_name),
                      re.MULTILINE)
    assert match, (table_name, column)
    return match.group(1)


def test_the_pool_name_pattern_is_the_crd_and_schema_check() -> None:
    assert crd_spec()["pool"]["pattern"] == bounds.POOL_PATTERN
    values = json.loads((ROOT / "charts" / "runlease" / "values.schema.json").read_text())
    assert values["properties"]["samplePool"]["properties"]["name"]["pattern"] \
        == bounds.POOL_PATTERN
    assert f"CHECK (name ~ '{bounds.POOL_PATTERN}')" in table("agent_run_pools")


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
def test_pool_defaults_are_the_crd_and_schema_defaults(crd_path: str, column: str,
                                                       value: int) -> None:
    prop: dict[str, Any] = {"properties": crd_spec()}
    for part in crd_path.split("."):
        prop = prop["properties"][part]
    assert prop["default"] == value
    assert column_default("agent_run_pools", column) == str(value)


def test_a_runs_default_max_attempts_is_the_pools() -> None:
    assert column_default("agent_runs", "max_attempts") == str(defaults.DEFAULT_MAX_ATTEMPTS)


def test_run_statuses_are_the_schema_check_and_the_api_literal() -> None:
    from runlease.api.schemas import Status

    match = re.search(r"CHECK \(status IN \(([^)]*)\)\)", table("agent_runs"))
    assert match
    in_sql = [s.strip().strip("'") for s in match.group(1).split(",")]
    assert in_sql == [s.value for s in RunStatus]
    assert list(typing.get_args(Status)) == [s.value for s in RunStatus]
