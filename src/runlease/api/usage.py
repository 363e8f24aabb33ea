"""GET /v1/usage: tokens and cost by tenant, pool or UTC day. A tenant sees
its own usage only; admin sees everyone's, or one tenant's with tenant_id."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from runlease.api.deps import Store, Who
from runlease.api.errors import invalid
from runlease.api.schemas import POOL_PATTERN
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


@router.get("/usage", response_model=UsageReport, response_model_by_alias=True)
async def usage(
    who: Who, store: Store,
    start: Annotated[date | None, Query(alias="from",
                                        description="First UTC day; default: `to`.")] = None,
    end: Annotated[date | None, Query(alias="to", description="Last UTC day (inclusive); "
                                                               "default: today.")] = None,
    group_by: Literal["tenant", "pool", "day"] = "day",
    tenant_id: Annotated[str | None, Query(min_length=1, max_length=bounds.TENANT_MAX_CHARS,
                                           description="Admin: one tenant only.")] = None,
    pool: Annotated[str | None, Query(min_length=1, max_length=bounds.POOL_MAX_CHARS,
                                      pattern=POOL_PATTERN)] = None,
) -> UsageReport:
    """Model usage the agents reported (tokens, cost), summed by `group_by`
    over the UTC days from `from` to `to`, at most 366 days."""
    if not who.admin:
        if tenant_id is not None and tenant_id != who.tenant_id:
            raise invalid("tenant_id", "a tenant token sees its own usage only")
        tenant_id = who.tenant_id
    end = end or datetime.now(UTC).date()
    start = start or end
    if end < start:
        raise invalid("to", "must not be before from")
    if (end - start).days >= MAX_REPORT_DAYS:
        raise invalid("to", f"a report spans at most {MAX_REPORT_DAYS} days")
    rows = await store.usage_report(start=start, end=end, group_by=group_by,
                                    tenant_id=tenant_id, pool=pool)
    return UsageReport.model_validate({
        "group_by": group_by, "from": start, "to": end,
        "items": [UsageItem(key=r.key, input_tokens=r.input_tokens,
                            output_tokens=r.output_tokens,
                            tokens=r.input_tokens + r.output_tokens, cost=r.cost,
                            records=r.records) for r in rows]})
