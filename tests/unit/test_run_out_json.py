"""The batch answer's fast rendering (plain dicts through pydantic-core) is
the same text RunOut renders, for tenants and admins, leased or finished."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from uuid import UUID

import pytest
from pydantic import TypeAdapter
from pydantic_core import to_json

from runlease.api.schemas import RunOut, run_out_fields
from runlease.core.states import RunStatus
from runlease.db.models import Run

AT = datetime(2026, 12, 1, 9, 30, 1, 123456, tzinfo=UTC)
BASE = dict(id=UUID("0193e0a0-0000-7000-8000-000000000001"), pool="default",
            tenant_id="acme", priority=3, attempts=1, max_attempts=5, lease_epoch=2,
            available_at=AT, input_json={"q": "é\u2028", "n": [1, 2.5, None]},
            budget_json={"max_turns": 4}, created_at=AT,
            updated_at=AT.astimezone(timezone(timedelta(hours=2))))
RUNS = [
    Run(**BASE, status=RunStatus.PENDING),
    Run(**BASE, status=RunStatus.LEASED, locked_by="w-1", locked_until=AT, event_seq=7,
        labels={"team": "search"}, idempotency_key="k-1", cancel_requested_at=AT),
    Run(**BASE, status=RunStatus.DEAD, result_json=[{"x": 1}], error_code="agent_error",
        error_message="boom", finished_at=AT),
    # A child with its own retry policy and usage, waiting for its children.
    Run(**BASE, status=RunStatus.PENDING, backoff_base_s=7, backoff_cap_s=90,
        non_retryable_codes=["invalid_input"], input_tokens=1520, output_tokens=310,
        cost=Decimal("0.0042"), turns_used=3, tool_calls_used=2,
        parent_run_id=UUID("0193e0a0-0000-7000-8000-000000000002"), awaiting_children=True),
]


@pytest.mark.parametrize("admin", [False, True])
@pytest.mark.parametrize("run", RUNS,
                         ids=lambda r: f"{r.status.value}-{r.parent_run_id is not None}")
def test_fields_render_as_the_model_does(run: Run, admin: bool) -> None:
    assert to_json(run_out_fields(run, admin=admin)) == \
        TypeAdapter(RunOut).dump_json(RunOut.of(run, admin=admin))


def test_fields_are_the_models_in_its_order() -> None:
    assert list(run_out_fields(RUNS[0], admin=True)) == [f.name for f in fields(RunOut)]


@pytest.mark.parametrize("limit", [3, 4])
def test_a_page_renders_as_the_model_does(limit: int) -> None:
    from runlease.api.schemas import RunPage, run_page_json
    want = RunPage(items=[RunOut.of(r, admin=False) for r in RUNS],
                   next_cursor=str(RUNS[-1].id) if len(RUNS) == limit else None)
    assert run_page_json(RUNS, limit, admin=False) == want.model_dump_json().encode()
