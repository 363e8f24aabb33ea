"""GET /v1/usage: tokens and cost by tenant, pool or UTC day. A tenant sees
its own usage only; admin sees everyone's, or one tenant's with tenant_id."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, BeforeValidator, Field

from runlease.api.deps import Store, Who
from runlease.api.errors import ErrorAnswer
from runlease.api.schemas import POOL_PATTERN, TENANT_PATTERN
from runlease.core import bounds
from runlease.db.usage import MAX_REPORT_DAYS

router = APIRouter(prefix="/v1")


class UsageItem(BaseModel):
    key: str = Field(description="The tenant, the pool, or the day (YYYY-MM-DD).")
    input_tokens: int
    output_tokens: int
    tokens: int
    cost: float
    records: int = Field(description="How many usage reports were summed.")


class UsageReport(BaseModel):
    group_by: Literal["tenant", "pool", "day"]
    start: date = Field(alias="from")
    end: date = Field(alias="to")
    items: list[UsageItem]


def _a_day(value: object) -> object:
    """pydantic would read a number (`0`) as a Unix time; the document says a
    day (YYYY-MM-DD), so only that is taken."""
    if isinstance(value, int | float) or (
            isinstance(value, str) and value.strip().lstrip("+-").isdigit()):
        raise ValueError("a day as YYYY-MM-DD, not a number")
    return value


@router.get("/usage", response_model=UsageReport, response_model_by_alias=True)
async def usage(
    who: Who, store: Store,
    start: Annotated[date | None, BeforeValidator(_a_day),
                     Query(alias="from", description="First UTC day; default: `to`.")] = None,
    end: Annotated[date | None, BeforeValidator(_a_day),
                   Query(alias="to", description="Last UTC day (inclusive); default: today.")
                   ] = None,
    group_by: Literal["tenant", "pool", "day"] = "day",
    tenant_id: Annotated[str | None, Query(min_length=1, max_length=bounds.TENANT_MAX_CHARS,
                                           pattern=TENANT_PATTERN,
                                           description="Admin: one tenant only.")] = None,
    pool: Annotated[str | None, Query(min_length=1, max_length=bounds.POOL_MAX_CHARS,
                                      pattern=POOL_PATTERN)] = None,
) -> UsageReport:
    """Model usage the agents reported (tokens, cost), summed by `group_by`
    over the UTC days from `from` to `to`: at most the last 366 days of that
    span (the answer's `from` says which); `from` after `to` covers none."""
    if not who.admin:
        if tenant_id is not None and tenant_id != who.tenant_id:
            raise ErrorAnswer(403, "forbidden", "tenant_id: a tenant token sees its own usage only",
                              "tenant_id")
        tenant_id = who.tenant_id
    end = end or datetime.now(UTC).date()
    start = start or end
    # Rules between two parameters (and today) that a schema cannot state
    # answer with what they cover, not a 422: a span longer than the bound
    # is its last MAX_REPORT_DAYS days (the answer's `from` says so), and
    # `from` after `to` covers no day.
    if end.toordinal() > MAX_REPORT_DAYS:  # else no day before it to cut (0001-01-05)
        start = max(start, end - timedelta(days=MAX_REPORT_DAYS - 1))
    rows = [] if end < start else await store.usage_report(
        start=start, end=end, group_by=group_by, tenant_id=tenant_id, pool=pool)
    return UsageReport.model_validate({
        "group_by": group_by, "from": start, "to": end,
        "items": [UsageItem(key=r.key, input_tokens=r.input_tokens,
                            output_tokens=r.output_tokens,
                            tokens=r.input_tokens + r.output_tokens, cost=r.cost,
                            records=r.records) for r in rows]})
