"""Child runs (statements in sql/children.sql): a run submits children in
its tenant, lists them, waits for them without holding a worker slot, and a
cancel of a parent reaches its descendants.

    wait (children)  leased & mine -> pending, attempts -= 1, awaiting_children,
                     available_at far ahead (out of every claim path)
    wake (leader)    awaiting & every child finished -> due now (promoted by a claim)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from runlease import tracing
from runlease.core.states import RunStatus
from runlease.db.channels import POOL_CHANNEL_PREFIX
from runlease.db.executor import Conn, stale_writes
from runlease.db.models import Lease, Run
from runlease.db.rates import RateStore
from runlease.db.runs import NewRun, QueueStore
from runlease.errors import LeaseLost, RunNotFound, ValidationError

MAX_CHILDREN = 1000  # per parent
MAX_CASCADE = 10_000


class ParentRefused(ValidationError):
    """A parent that cannot take a child (finished, cancelled, another pool's
    tenant, too many children): a 422 at the API."""


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """What wait_children hands the parent about one child."""

    id: UUID
    status: str
    result: Any
    error_code: str | None

    def to_json(self) -> dict[str, Any]:
        return {"id": str(self.id), "status": self.status, "result": self.result,
                "error_code": self.error_code}


class ChildStore(QueueStore, RateStore):
    async def check_parent(self, parent_id: UUID, tenant_id: str, *, conn: Conn,
                           admin: bool = False) -> None:
        """In the transaction that enqueues a child: the parent exists and is
        the tenant's (RunNotFound otherwise, as for any other tenant's run; an
        admin naming another tenant gets ParentRefused), is not finished or
        being cancelled, and has room (ParentRefused)."""
        rows = await self._rows("run_parent_get", {"id": parent_id}, conn)
        if not rows or (rows[0]["tenant_id"] != tenant_id and not admin):
            raise RunNotFound(parent_id)
        row = rows[0]
        if row["tenant_id"] != tenant_id:
            raise ParentRefused("parent_run_id", "the parent run belongs to another tenant")
        if row["status"] not in (RunStatus.PENDING, RunStatus.LEASED, RunStatus.WAITING) or \
                row["cancel_requested_at"] is not None:
            raise ParentRefused("parent_run_id", f"the parent run is {row['status']}"
                                + (" and being cancelled" if row["cancel_requested_at"]
                                   and row["status"] == RunStatus.LEASED else ""))
        if row["children"] >= MAX_CHILDREN:
            raise ParentRefused("parent_run_id", f"a run has at most {MAX_CHILDREN} children")

    async def set_parent(self, run: Run, parent_id: UUID, *, conn: Conn) -> Run:
        await self._rows("run_parent_set", {"id": run.id, "parent": parent_id}, conn)
        return await self.get(run.id, conn=conn)

    async def submit_child(
        self, lease: Lease, input: Mapping[str, Any], *,  # noqa: A002
        key: str, pool: str | None = None, priority: int = 0,
        max_attempts: int | None = None, budget: Mapping[str, Any] | None = None,
    ) -> Run:
        """Enqueue a child of the leased run, in its tenant (and its pool
        unless named), fenced by the parent's lease; `key` makes it
        idempotent (the same key again returns the same child)."""
        async with self.connection() as c, c.transaction():
            rows = await self._fenced_share(lease, c)
            if rows["children"] >= MAX_CHILDREN:
                raise ParentRefused("child", f"a run has at most {MAX_CHILDREN} children")
            child_pool = pool or lease.run.pool
            child_key = f"child:{lease.run_id}:{key}"[:255]
            if not await self.key_taken(child_pool, lease.run.tenant_id, child_key, conn=c):
                # A child is a submit of the tenant's: its rate and queue
                # quota count it (issue 32); Throttled reaches the agent.
                await self.admit_all(child_pool, lease.run.tenant_id, 1, conn=c)
            # The child joins its parent's trace, as a child of the span
            # that submitted it (the parent's attempt), when the worker traces.
            result = (await self.enqueue_many(child_pool, [NewRun(
                lease.run.tenant_id, input, priority, max_attempts, budget,
                child_key, traceparent=tracing.current_traceparent())], conn=c))[0]
            if not result.inserted:
                return result.run
            return await self.set_parent(result.run, lease.run_id, conn=c)

    async def _fenced_share(self, lease: Lease, conn: Conn) -> dict[str, Any]:
        rows = await self._rows("run_fence_share", {
            "id": lease.run_id, "epoch": lease.epoch, "worker": lease.worker}, conn)
        if not rows:
            stale_writes(lease.run.pool)
            raise LeaseLost(lease.run_id, lease.epoch)
        return dict(rows[0])

    async def children_outcomes(self, run_id: UUID, *,
                                conn: Conn | None = None) -> list[ChildOutcome]:
        rows = await self._rows("run_children_summary", {"id": run_id, "limit": MAX_CHILDREN},
                                conn)
        return [ChildOutcome(r["id"], r["status"], r["result_json"], r["error_code"])
                for r in rows]

    async def list_children(self, parent_id: UUID, *, tenant_id: str | None = None,
                            status: str | None = None, pool: str | None = None,
                            limit: int = 50, before: UUID | None = None,
                            conn: Conn | None = None) -> list[Run]:
        """A run's children, newest first; tenant_id scopes them to a tenant."""
        rows = await self._rows("run_children_list", {
            "parent": parent_id, "tenant": tenant_id, "status": status, "pool": pool,
            "limit": limit, "before": before}, conn)
        return [Run.from_row(r) for r in rows]

    async def wait_children(self, lease: Lease, *, conn: Conn | None = None) -> RunStatus:
        """The parent's attempt ends waiting for its children (see the module
        doc); returns where it went: pending (waiting, or due at once if no
        child is unfinished) or cancelled."""
        rows = await self._fenced("run_wait_children", lease, {}, conn)
        return RunStatus(rows[0]["status"])

    async def wake_parents(self, *, batch: int = 1000, conn: Conn | None = None) -> int:
        """Parents whose children have all finished become due; how many."""
        rows = await self._rows("run_children_wake", {
            "batch": batch, "channel_prefix": POOL_CHANNEL_PREFIX}, conn)
        return len(rows)

    async def cancel_descendants(self, run_id: UUID) -> int:
        """Request the cancel of every unfinished descendant of the run."""
        rows = await self._rows("run_descendants_open", {"id": run_id, "limit": MAX_CASCADE})
        for row in rows:
            await self.request_cancel(row["id"])
        return len(rows)
