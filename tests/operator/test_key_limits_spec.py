"""spec.concurrencyKeys of an AgentRunPool (issue 27): parsed into the
pool's key limits, checked by the store's own rules (a value the store would
refuse is an invalid spec, never a write retried for ever)."""

from __future__ import annotations

from typing import Any

import pytest

from runlease.db.keys import KeyLimits
from runlease.operator.spec import InvalidSpec, parse
from tests.operator.test_builders import MINIMAL


def test_key_limits_come_from_the_spec() -> None:
    spec = MINIMAL | {"concurrencyKeys": {"defaultLimit": 2, "limits": [
        {"key": "repo-main", "maxInFlight": 1}]}}
    assert parse("batch", "ml", spec).key_limits == KeyLimits(2, {"repo-main": 1})
    assert parse("batch", "ml", MINIMAL).key_limits == KeyLimits()


@pytest.mark.parametrize("keys", [
    {"defaultLimit": 0}, {"defaultLimit": -3}, {"defaultLimit": 10**6}, {"defaultLimit": "2"},
    {"limits": [{"key": "a b", "maxInFlight": 1}]}, {"limits": [{"key": "*", "maxInFlight": 1}]},
    {"limits": [{"key": "k", "maxInFlight": 0}]}, {"limits": [{"key": "k"}]},
    {"limits": [{"key": "k", "maxInFlight": 1}, {"key": "k", "maxInFlight": 2}]},
])
def test_a_bad_key_limit_is_an_invalid_spec(keys: dict[str, Any]) -> None:
    with pytest.raises(InvalidSpec, match="concurrencyKeys"):
        parse("batch", "ml", MINIMAL | {"concurrencyKeys": keys})
