"""Usage: tokens, cost, turns and tool calls summed per run across attempts,
the usage log and its daily rollup (statements in sql/usage.sql)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any, Literal
from uuid import UUID

from runlease.core import bounds
from runlease.db.executor import Conn, Executor
from runlease.db.models import Lease
from runlease.errors import RunNotFound, ValidationError

GroupBy = Literal["tenant", "pool", "day"]
GROUP_BY: tuple[GroupBy, ...] = ("tenant", "pool", "day")
MAX_REPORT_DAYS = 366
MAX_REPORT_ROWS = 1000
# Logged usage younger than this stays in the log: a tenant's token rate
# (runlease_claim) reads the last minute of it.
USAGE_LOG_KEEP_S = 120


@dataclass(frozen=True, slots=True)
class Usage:
    """A run's usage so far, every attempt's together."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    turns: int = 0
    tool_calls: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Usage:
        return cls(int(row["input_tokens"]), int(row["output_tokens"]), float(row["cost"]),
                   int(row["turns_used"]), int(row["tool_calls_used"]))

    def to_json(self) -> dict[str, Any]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cost": self.cost, "turns": self.turns, "tool_calls": self.tool_calls}


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One group of a usage report."""

    key: str
    input_tokens: int
    output_tokens: int
    cost: float
    records: int


class UsageStore(Executor):
    async def record_usage(
        self, lease: Lease, *, input_tokens: int = 0, output_tokens: int = 0,
        cost: float = 0.0, turns: int = 0, tool_calls: int = 0, conn: Conn | None = None,
    ) -> Usage:
        """Add tokens and cost to the run's usage and raise its turn and tool
        call counts to `turns` and `tool_calls` if higher (fenced: LeaseLost
        when the lease is gone); returns the run's totals over every attempt. Bad values (negative,
        NaN, huge) raise ValidationError and write nothing."""
        input_tokens, output_tokens, cost = bounds.check_usage(input_tokens, output_tokens,
                                                               cost)
        for field, value in (("turns", turns), ("tool_calls", tool_calls)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
                raise ValidationError(field, "must be an integer between 0 and 1000000")
        rows = await self._fenced("run_usage_record", lease, {
            "input_tokens": input_tokens, "output_tokens": output_tokens, "cost": cost,
            "turns": turns, "tool_calls": tool_calls}, conn)
        return Usage.from_row(rows[0])

    async def run_usage(self, run_id: UUID, *, conn: Conn | None = None) -> Usage:
        rows = await self._rows("run_usage_get", {"id": run_id}, conn)
        if not rows:
            raise RunNotFound(run_id)
        return Usage.from_row(rows[0])

    async def usage_rollup(self, *, batch: int = 5000, keep_s: int = USAGE_LOG_KEEP_S,
                           conn: Conn | None = None) -> int:
        """Fold one batch of logged usage older than keep_s into the daily
        rollup; returns how many log rows were folded."""
        rows = await self._rows("usage_rollup", {"batch": batch, "keep_s": keep_s}, conn)
        return int(rows[0]["moved"])

    async def usage_report(
        self, *, start: date, end: date, group_by: str, tenant_id: str | None = None,
        pool: str | None = None, conn: Conn | None = None,
    ) -> list[UsageRow]:
        """Usage from start to end (UTC days, inclusive) grouped by tenant,
        pool or day; tenant_id scopes it to one tenant."""
        if group_by not in GROUP_BY:
            raise ValidationError("group_by", f"must be one of {', '.join(GROUP_BY)}")
        if end < start:
            raise ValidationError("to", "must not be before from")
        if (end - start).days >= MAX_REPORT_DAYS:
            raise ValidationError("to", f"a report spans at most {MAX_REPORT_DAYS} days")
        if tenant_id is not None:
            bounds.check_tenant(tenant_id)
        if pool is not None:
            bounds.check_pool(pool)
        rows = await self._rows("usage_report", {
            "from": start, "to": end, "group_by": group_by, "tenant": tenant_id,
            "pool": pool, "limit": MAX_REPORT_ROWS}, conn)
        return [UsageRow(r["key"], int(r["input_tokens"]), int(r["output_tokens"]),
                         float(r["cost"]), int(r["records"])) for r in rows]
