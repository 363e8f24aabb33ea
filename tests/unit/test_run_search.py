"""db/run_search.py without a database: every statement a tenant's filter
composes is scoped to that tenant, and bad filters are refused by name."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from psycopg import sql

from runlease.core.states import RunStatus
from runlease.db.run_search import RunFilter, select_runs, uuid_floor
from runlease.errors import ValidationError

AT = datetime(2026, 12, 1, tzinfo=UTC)
PARTS = {
    "statuses": (RunStatus.DEAD,), "pool": "default", "labels": (("team", "x' OR 1=1 --"),),
    "created_after": AT, "finished_before": AT, "idempotency_key": "k",
}


def text(query: sql.Composed) -> str:
    return query.as_string(None)


@pytest.mark.parametrize("names", [c for n in range(len(PARTS) + 1)
                                   for c in itertools.combinations(PARTS, n)])
def test_a_tenants_statement_is_scoped_to_it_and_values_are_parameters(
        names: tuple[str, ...]) -> None:
    f = RunFilter(tenant_id="acme", **{n: PARTS[n] for n in names}).validated()
    query, params = select_runs(f, limit=10)
    assert "r.tenant_id = %(tenant)s" in text(query)
    assert params["tenant"] == "acme"
    assert "OR 1=1" not in text(query)  # label values are parameters, never text


@pytest.mark.parametrize(("f", "field"), [
    (RunFilter(statuses=("running",)), "status"),  # type: ignore[arg-type]
    (RunFilter(labels=(("bad key", "v"),)), "label"),
    (RunFilter(labels=(("k", "\x00"),)), "label"),
    (RunFilter(created_after=datetime(2026, 1, 1)), "created_after"),
    (RunFilter(idempotency_key="k"), "idempotency_key"),  # a key needs a tenant
    (RunFilter(tenant_id=""), "tenant_id"),
])
def test_bad_filters_are_refused_by_name(f: RunFilter, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        f.validated()
    assert err.value.field == field


def test_uuid_floor_orders_with_uuid7_ids() -> None:
    from runlease.core.ids import uuid7

    before = uuid_floor(datetime.now(UTC))
    assert before < uuid7()
