"""Bulk actions on runs: cancel and redrive by id list or by filter, and
re-prioritising a pending run (statements in sql/run_bulk.sql).

A bulk action works in bounded batches (one short transaction each), walks
the matching runs newest first by id (a keyset cursor, so runs it changes
do not move it), stops after BULK_MAX_RUNS, and gives each run it changes
an audit event naming who asked and the operation's id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from runlease.core import bounds
from runlease.core.ids import uuid7
from runlease.core.states import RunStatus
from runlease.db.channels import CANCEL_CHANNEL, POOL_CHANNEL_PREFIX
from runlease.db.executor import Conn
from runlease.db.models import Run
from runlease.db.runs import QueueStore
from runlease.errors import InvalidTransition, ValidationError

BULK_IDS_MAX = 1_000
BULK_BATCH = 500
BULK_MAX_RUNS = 100_000  # per request; the answer says when it stopped there
REPORTED_IDS_MAX = 1_000

Action = Literal["cancel", "redrive"]
# The statuses each action applies to; a filter's statuses narrow them.
_APPLIES_TO: dict[Action, frozenset[str]] = {
    "cancel": frozenset({"pending", "leased"}),
    "redrive": frozenset({"dead"}),
}


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Which runs a bulk action means (None: any)."""

    statuses: tuple[str, ...] | None = None
    pool: str | None = None


@dataclass(frozen=True, slots=True)
class BulkResult:
    op_id: UUID
    action: Action
    dry_run: bool
    matched: int  # runs the action applies to (what a dry run counts)
    affected: int  # runs it changed (0 for a dry run)
    ids: tuple[UUID, ...]  # the changed runs' ids, at most REPORTED_IDS_MAX
    truncated: bool  # stopped at BULK_MAX_RUNS: run it again for the rest


def _statuses(action: Action, wanted: tuple[str, ...] | None) -> list[str]:
    applies = _APPLIES_TO[action]
    if wanted is None:
        return sorted(applies)
    for s in wanted:
        try:
            RunStatus(s)
        except ValueError:
            raise ValidationError("filter.status", f"unknown status {s!r}") from None
    return sorted(applies.intersection(wanted))


class BulkStore(QueueStore):
    async def bulk_action(
        self, action: Action, *, by: str, tenant_id: str | None,
        ids: Sequence[UUID] | None = None, where: RunFilter | None = None,
        dry_run: bool = False, conn: Conn | None = None,
    ) -> BulkResult:
        """Cancel (pending and leased runs) or redrive (dead runs) the runs
        named by `ids` (at most BULK_IDS_MAX) or matched by `where`, within
        `tenant_id` when given (a tenant's token always gives its own)."""
        if (ids is None) == (where is None):
            raise ValidationError("ids", "give either ids or a filter, not both")
        if ids is not None and not 1 <= len(ids) <= BULK_IDS_MAX:
            raise ValidationError("ids", f"must name 1 to {BULK_IDS_MAX} runs, got {len(ids)}")
        where = where or RunFilter()
        if where.pool is not None:
            bounds.check_pool(where.pool)
        statuses = _statuses(action, where.statuses)
        op_id = uuid7()
        matched = affected = 0
        changed: list[UUID] = []
        cursor: UUID | None = None
        truncated = False
        while statuses:
            batch = [r["id"] for r in await self._rows(
                "run_bulk_select" if tenant_id is None else "run_bulk_select_tenant",
                {"tenant": tenant_id, "statuses": statuses, "pool": where.pool,
                 "ids": None if ids is None else list(ids), "before": cursor,
                 "limit": BULK_BATCH}, conn)]
            if not batch:
                break
            matched += len(batch)
            if not dry_run:
                done = await self._apply(action, batch, tenant_id, op_id, by, conn)
                affected += len(done)
                changed.extend(done[:REPORTED_IDS_MAX - len(changed)])
            cursor = batch[-1]
            if len(batch) < BULK_BATCH:
                break
            if matched >= BULK_MAX_RUNS:
                truncated = True
                break
        return BulkResult(op_id, action, dry_run, matched, affected, tuple(changed), truncated)

    async def _apply(self, action: Action, ids: list[UUID], tenant_id: str | None,
                     op_id: UUID, by: str, conn: Conn | None) -> list[UUID]:
        params = {"ids": ids, "tenant": tenant_id, "op": str(op_id), "by": by}
        if action == "cancel":
            rows = await self._rows("run_bulk_cancel", params | {"channel": CANCEL_CHANNEL},
                                    conn)
        else:
            rows = await self._rows("run_bulk_redrive",
                                    params | {"channel_prefix": POOL_CHANNEL_PREFIX}, conn)
        return [r["id"] for r in rows]

    async def reprioritize(self, run_id: UUID, priority: int, *, by: str,
                           tenant_id: str | None = None, conn: Conn | None = None) -> Run:
        """A pending run's new priority, within its tenant's band in its pool:
        RunNotFound, InvalidTransition (not pending) or ValidationError (outside
        the band) when refused."""
        bounds.check_priority(priority)
        rows = await self._rows("run_reprioritize", {"id": run_id, "priority": priority,
                                                     "tenant": tenant_id, "by": by}, conn)
        if rows:
            return Run.from_row(rows[0])
        run = await self.get(run_id, tenant_id=tenant_id, conn=conn)
        if run.status is not RunStatus.PENDING:
            raise InvalidTransition(run_id, "re-prioritise", run.status)
        band = await self._rows("tenant_band_get", {"pool": run.pool, "tenant": run.tenant_id},
                                conn)
        lo = band[0]["priority_min"] if band else None
        hi = band[0]["priority_max"] if band else None
        lo = bounds.PRIORITY_MIN if lo is None else lo
        hi = bounds.PRIORITY_MAX if hi is None else hi
        raise ValidationError("priority", f"must be between {lo} and {hi} for tenant "
                                          f"{run.tenant_id!r} in pool {run.pool!r} (the band "
                                          f"an admin set), got {priority}")
