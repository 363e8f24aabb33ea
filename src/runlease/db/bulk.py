"""Bulk actions on runs: cancel and redrive by id list or by filter, and
re-prioritising a pending run (statements in sql/run_bulk.sql).

A bulk action works in bounded batches (one short transaction each), walks
the matching runs newest first by id (a keyset cursor, so runs it changes
do not move it), stops after BULK_MAX_RUNS, and gives each run it changes
an audit event naming who asked and the operation's id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal
from uuid import UUID

from psycopg import sql

from runlease.core import bounds
from runlease.core.ids import uuid7
from runlease.core.states import RunStatus
from runlease.db.channels import CANCEL_CHANNEL, POOL_CHANNEL_PREFIX
from runlease.db.executor import Conn
from runlease.db.models import Run
from runlease.db.run_search import RunFilter, select_runs
from runlease.db.runs import QueueStore
from runlease.errors import InvalidTransition, ValidationError

BULK_IDS_MAX = 1_000
BULK_BATCH = 500
BULK_MAX_RUNS = 100_000  # per request; the answer says when it stopped there
REPORTED_IDS_MAX = 1_000

Action = Literal["cancel", "redrive"]
# The statuses each action applies to; a filter's statuses narrow them.
_APPLIES_TO: dict[Action, frozenset[str]] = {
    "cancel": frozenset({"pending", "leased", "waiting"}),
    "redrive": frozenset({"dead"}),
}


@dataclass(frozen=True, slots=True)
class BulkResult:
    op_id: UUID
    action: Action
    dry_run: bool
    matched: int  # runs the action applies to (what a dry run counts)
    affected: int  # runs it changed (0 for a dry run)
    ids: tuple[UUID, ...]  # the changed runs' ids, at most REPORTED_IDS_MAX
    truncated: bool  # stopped at BULK_MAX_RUNS: run it again for the rest


def _statuses(action: Action, wanted: tuple[RunStatus, ...]) -> list[str]:
    """The statuses the action applies to, narrowed by the filter's."""
    applies = _APPLIES_TO[action]
    if not wanted:
        return sorted(applies)
    return sorted(applies.intersection(RunStatus(s).value for s in wanted))


class BulkStore(QueueStore):
    async def bulk_action(
        self, action: Action, *, by: str, tenant_id: str | None = None,
        ids: Sequence[UUID] | None = None, where: RunFilter | None = None,
        dry_run: bool = False, conn: Conn | None = None,
    ) -> BulkResult:
        """Cancel (pending and leased runs) or redrive (dead runs) the runs
        named by `ids` (at most BULK_IDS_MAX) within `tenant_id` when given,
        or matched by `where` (the listing's filter, tenant-scoped by its
        tenant_id: a tenant's token always gives its own)."""
        if (ids is None) == (where is None):
            raise ValidationError("ids", "give either ids or a filter, not both")
        if ids is not None and not 1 <= len(ids) <= BULK_IDS_MAX:
            raise ValidationError("ids", f"must name 1 to {BULK_IDS_MAX} runs, got {len(ids)}")
        if where is not None:
            where = where.validated()
            tenant_id = where.tenant_id
        statuses = _statuses(action, () if where is None else where.statuses)
        op_id = uuid7()
        matched = affected = 0
        changed: list[UUID] = []
        cursor: UUID | None = None
        truncated = False
        while statuses:
            if where is None:
                batch = [r["id"] for r in await self._rows(
                    "run_bulk_select" if tenant_id is None else "run_bulk_select_tenant",
                    {"tenant": tenant_id, "statuses": statuses, "pool": None,
                     "ids": list(ids or ()), "before": cursor, "limit": BULK_BATCH}, conn)]
            else:
                batch = await self._select_ids(
                    replace(where, statuses=tuple(RunStatus(s) for s in statuses)), cursor,
                    conn)
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

    async def _select_ids(self, where: RunFilter, before: UUID | None,
                          conn: Conn | None) -> list[UUID]:
        """One batch of what the filter matches, as the listing finds it."""
        query, params = select_runs(where, limit=BULK_BATCH, before=before,
                                    columns=sql.SQL("r.id"))
        async with self.connection(conn) as c, c.cursor() as cur:
            await cur.execute(query, params)
            return [r["id"] for r in await cur.fetchall()]

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
