"""The usage page: model tokens and cost per UTC day, tenant and pool (what
`GET /v1/usage` answers, by all three at once), with a chart of tokens per
day. A tenant sees its own usage only; an admin everyone's, or one tenant's."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from runlease.api.console.deps import BadRequest, Store, Who, console_state
from runlease.core import bounds
from runlease.db.console import MAX_USAGE_ROWS, UsageDay
from runlease.db.usage import MAX_REPORT_DAYS
from runlease.errors import ValidationError

router = APIRouter(prefix="/ui", include_in_schema=False)

DEFAULT_DAYS = 14
CHART_DAYS_MAX = 120  # more days than this are summed in the table, not drawn


@dataclass(frozen=True, slots=True)
class DayBar:
    day: date
    tokens: int
    cost: float
    x: float  # percent
    width: float
    height: float  # percent of the chart's plot height


def _minus(day: date, days: int) -> date:
    """day - days, or the calendar's first day (no OverflowError: issue 32's 500s)."""
    return date.fromordinal(max(1, day.toordinal() - days))


def _day(args: Any, name: str, default: date) -> date:
    raw = str(args.get(name, "")).strip()
    if not raw:
        return default
    try:
        if len(raw) != 10:
            raise ValueError(raw)
        return date.fromisoformat(raw)
    except ValueError:
        raise BadRequest(f"{name}: a day as YYYY-MM-DD") from None


def _checked(check: Any, value: str) -> str | None:
    try:
        return str(check(value)) if value else None
    except ValidationError as exc:
        raise BadRequest(f"{exc.field}: {exc.message}") from None


def chart(rows: list[UsageDay], start: date, end: date) -> list[DayBar]:
    """One bar a day from start to end (the last CHART_DAYS_MAX days), its
    height the day's tokens against the largest day's."""
    start = max(start, _minus(end, CHART_DAYS_MAX - 1))
    days = (end - start).days + 1
    if days <= 0:
        return []
    tokens: dict[date, int] = {}
    cost: dict[date, float] = {}
    for r in rows:
        tokens[r.day] = tokens.get(r.day, 0) + r.tokens
        cost[r.day] = cost.get(r.day, 0.0) + r.cost
    top = max(tokens.values(), default=0)
    width = 100.0 / days
    return [DayBar(d, tokens.get(d, 0), cost.get(d, 0.0), round(i * width, 3),
                   round(width * 0.8, 3),
                   round(100.0 * tokens.get(d, 0) / top, 2) if top else 0.0)
            for i, d in enumerate(start + timedelta(days=n) for n in range(days))]


@router.get("/usage")
async def usage_page(request: Request, who: Who, store: Store) -> Response:
    args = request.query_params
    today = datetime.now(UTC).date()
    end = _day(args, "to", today)
    start = _day(args, "from", _minus(end, DEFAULT_DAYS - 1))
    if end < start:
        raise BadRequest("from: must not be after to")
    if (end - start).days >= MAX_REPORT_DAYS:
        raise BadRequest(f"from: the page spans at most {MAX_REPORT_DAYS} days")
    pool = _checked(bounds.check_pool, args.get("pool", "").strip())
    tenant = _checked(bounds.check_tenant, args.get("tenant", "").strip()) if who.admin else None
    rows = await store.usage_by_day(start=start, end=end, tenant_id=tenant or who.scope,
                                    pool=pool)
    totals = {"input_tokens": sum(r.input_tokens for r in rows),
              "output_tokens": sum(r.output_tokens for r in rows),
              "cost": sum(r.cost for r in rows), "records": sum(r.records for r in rows)}
    return console_state(request).renderer.page(request, "usage.html", {
        "viewer": who, "rows": rows, "start": start, "end": end, "pool": pool or "",
        "tenant": tenant or "", "bars": (bars := chart(rows, start, end)), "totals": totals,
        "top": max((b.tokens for b in bars), default=0),
        "more": len(rows) == MAX_USAGE_ROWS})
