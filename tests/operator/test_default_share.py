"""A default per-tenant share of a pool (issue 32: with no cap by default,
one tenant held every slot and another waited 27 s). With no
tenants.defaultMaxInFlight, each tenant's cap is defaultSharePercent (50 by
default) of the pool's slots at replicas.max; the claim holds it across
workers (tests/integration/test_limits.py proves the cap itself)."""

from __future__ import annotations

from typing import Any

import pytest

from runlease.operator.spec import InvalidSpec, parse

BASE: dict[str, Any] = {"image": "img", "agent": "a:b",
                        "database": {"secretKeyRef": {"name": "pg"}},
                        "concurrencyPerWorker": 4, "replicas": {"min": 1, "max": 3}}


@pytest.mark.parametrize(("tenants", "cap"), [
    ({}, 6),  # 50% of 3 x 4 slots
    ({"defaultSharePercent": 25}, 3),
    ({"defaultSharePercent": 1}, 1),  # at least one
    ({"defaultSharePercent": 100}, None),  # no cap, as before
    ({"defaultMaxInFlight": 2, "defaultSharePercent": 10}, 2),  # an explicit cap wins
    ({"defaultMaxInFlight": 0}, 0),
])
def test_each_tenant_gets_a_share_of_the_pool_by_default(tenants: dict[str, Any],
                                                         cap: int | None) -> None:
    assert parse("p", "ns", BASE | {"tenants": tenants}).default_max_in_flight == cap


@pytest.mark.parametrize("share", [0, 101, -5, "50", True, 50.5])
def test_a_hostile_share_is_refused(share: object) -> None:
    with pytest.raises(InvalidSpec, match="defaultSharePercent"):
        parse("p", "ns", BASE | {"tenants": {"defaultSharePercent": share}})
