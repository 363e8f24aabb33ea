"""The run queue outside a worker's lease: enqueue, read, cancel, redrive,
reap and retention (statements in sql/runs.sql)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from runlease.core import bounds
from runlease.core.ids import uuid7
from runlease.core.states import RunStatus
from runlease.db.channels import CANCEL_CHANNEL, POOL_CHANNEL_PREFIX
from runlease.db.executor import Conn, Executor
from runlease.db.models import EnqueueResult, ReapResult, Run
from runlease.errors import (
    IdempotencyConflict,
    InvalidTransition,
    RunleaseError,
    RunNotFound,
    UnknownPool,
    ValidationError,
)

MAX_BATCH = 10_000  # reap and retention
MAX_LIST_LIMIT = 500


def _check_batch(batch: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise ValidationError("batch", f"must be between 1 and {MAX_BATCH}")


@dataclass(frozen=True, slots=True)
class NewRun:
    """One run to enqueue; `max_attempts` None takes the pool's default."""

    tenant_id: str
    input: Mapping[str, Any]
    priority: int = 0
    max_attempts: int | None = None
    budget: Mapping[str, Any] | None = None
    idempotency_key: str | None = None


class QueueStore(Executor):
    """The queue as the API and operations see it: no lease needed."""

    async def enqueue(
        self,
        pool: str,
        tenant_id: str,
        input: Mapping[str, Any],  # noqa: A002 - the run's input, as the API names it
        *,
        priority: int = 0,
        max_attempts: int | None = None,
        budget: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        conn: Conn | None = None,
    ) -> EnqueueResult:
        run = NewRun(tenant_id, input, priority, max_attempts, budget, idempotency_key)
        (result,) = await self.enqueue_many(pool, [run], conn=conn)
        return result

    async def enqueue_many(
        self, pool: str, runs: Sequence[NewRun], *, conn: Conn | None = None
    ) -> list[EnqueueResult]:
        """Enqueue a batch in one INSERT; results in the order given.

        All or nothing: an invalid item, an unknown pool or an idempotency key
        reused with another input writes none of the batch.
        """
        bounds.check_pool(pool)
        if not runs:
            return []
        ids: list[UUID] = []
        tenants: list[str] = []
        priorities: list[int] = []
        attempts: list[int | None] = []
        budgets: list[str] = []
        inputs: list[str] = []
        keys: list[str | None] = []
        seen_keys: set[tuple[str, str]] = set()
        for i, run in enumerate(runs):
            where = f"runs[{i}]." if len(runs) > 1 else ""
            try:
                tenants.append(bounds.check_tenant(run.tenant_id))
                priorities.append(bounds.check_priority(run.priority))
                attempts.append(
                    None
                    if run.max_attempts is None
                    else bounds.check_max_attempts(run.max_attempts)
                )
                budgets.append(bounds.json_text("budget", bounds.Budget.parse(run.budget).to_json(),
                                                self.max_input_bytes))
                inputs.append(bounds.check_object("input", run.input, self.max_input_bytes))
                key = run.idempotency_key
                if key is not None:
                    bounds.check_idempotency_key(key)
                    if (run.tenant_id, key) in seen_keys:
                        raise ValidationError("idempotency_key", "repeated within one batch")
                    seen_keys.add((run.tenant_id, key))
                keys.append(key)
            except ValidationError as exc:
                raise ValidationError(where + exc.field, exc.message) from None
            ids.append(uuid7())

        params: dict[str, Any] = {
            "pool": pool,
            "ids": ids,
            "tenants": tenants,
            "priorities": priorities,
            "max_attempts": attempts,
            "budgets": budgets,
            "inputs": inputs,
            "keys": keys,
            "channel_prefix": POOL_CHANNEL_PREFIX,
        }
        async with self.connection(conn) as c, c.transaction():
            rows = await self._rows("run_enqueue", params, c)
            by_key = {(r["tenant_id"], r["idempotency_key"]): r for r in rows}
            by_id = {r["id"]: r for r in rows}
            results: list[EnqueueResult] = []
            for i, (run, run_id, key) in enumerate(zip(runs, ids, keys, strict=True)):
                row = by_id.get(run_id) or (by_key.get((run.tenant_id, key)) if key else None)
                if row is None:
                    try:
                        await self._explain_missing(pool, run.tenant_id, key, c,
                                                    run.priority)
                    except UnknownPool:
                        raise
                    except ValidationError as exc:
                        where = f"runs[{i}]." if len(runs) > 1 else ""
                        raise ValidationError(where + exc.field, exc.message) from None
                    raise RunleaseError(f"enqueue returned no row for run {run_id}")
                results.append(EnqueueResult(Run.from_row(row), bool(row["inserted"])))
            return results

    async def _explain_missing(self, pool: str, tenant: str, key: str | None, c: Conn,
                               priority: int | None = None) -> None:
        """A row the insert did not return: the pool is unknown, the priority
        is outside the tenant's band, or the key names a run with another
        input. Raising rolls the batch back."""
        if not await self._rows("pool_get", {"name": pool}, c):
            raise UnknownPool(pool)
        band = await self._rows("tenant_band_get", {"pool": pool, "tenant": tenant}, c)
        lo, hi = ((band[0]["priority_min"], band[0]["priority_max"]) if band else (None, None))
        lo = bounds.PRIORITY_MIN if lo is None else lo
        hi = bounds.PRIORITY_MAX if hi is None else hi
        if priority is not None and not lo <= priority <= hi:
            # Refused, not clamped: a clamped priority would silently reorder
            # the tenant's runs in a way it did not ask for.
            raise ValidationError(
                "priority", f"must be between {lo} and {hi} for tenant {tenant!r} in pool "
                            f"{pool!r} (the band an admin set), got {priority}")
        if key is not None:
            rows = await self._rows(
                "run_get_by_keys", {"pool": pool, "tenant": tenant, "keys": [key]}, c
            )
            if rows:
                raise IdempotencyConflict(rows[0]["id"], key)

    async def request_cancel(
        self, run_id: UUID, *, tenant_id: str | None = None, strict: bool = False,
        conn: Conn | None = None,
    ) -> Run:
        """Stop a run: a pending one is cancelled at once, a leased one gets
        cancel_requested_at and its worker is notified. A finished run is
        returned unchanged, or with `strict` raises InvalidTransition (its status)."""
        rows = await self._rows(
            "run_request_cancel",
            {"id": run_id, "tenant": tenant_id, "channel": CANCEL_CHANNEL},
            conn,
        )
        run = await self.get(run_id, tenant_id=tenant_id, conn=conn)
        if strict and not rows:
            raise InvalidTransition(run_id, "cancel", run.status)
        return run

    async def reap(self, *, batch: int = 1000, also: Sequence[UUID] = (),
                   conn: Conn | None = None) -> ReapResult:
        """Expired leases back to pending (or dead / cancelled), one bounded
        batch: those of workers whose registry row expired (or that have
        none), and of `also` (what sweep_leases found) those that expired."""
        _check_batch(batch)
        rows = await self._rows(
            "run_reap",
            {"batch": batch, "ids": list(also), "channel_prefix": POOL_CHANNEL_PREFIX}, conn
        )
        counts = {s: 0 for s in ("pending", "dead", "cancelled")}
        for r in rows:
            counts[r["status"]] += 1
        return ReapResult(
            to_pending=counts["pending"],
            to_dead=counts["dead"],
            to_cancelled=counts["cancelled"],
            reaped=tuple((r["id"], r["pool"], r["tenant_id"], r["status"]) for r in rows),
        )

    async def sweep_leases(
        self, after: tuple[str, UUID] | None, *, rows: int = 1000, conn: Conn | None = None
    ) -> tuple[list[UUID], tuple[str, UUID] | None]:
        """One window of `rows` leases after the cursor `after` (None: from
        the start): the expired ones' ids, and the cursor for the next
        window (None once the window reached the end)."""
        _check_batch(rows)
        found = await self._rows(
            "run_lease_sweep",
            {"after_by": "" if after is None else after[0],
             "after_id": UUID(int=0) if after is None else after[1], "rows": rows}, conn)
        expired = [r["id"] for r in found if r["expired"]]
        cursor = (found[-1]["locked_by"], found[-1]["id"]) if len(found) == rows else None
        return expired, cursor

    async def redrive(
        self, run_id: UUID, *, tenant_id: str | None = None, conn: Conn | None = None
    ) -> Run:
        """A dead run back to pending with its attempts reset."""
        rows = await self._rows(
            "run_redrive",
            {"id": run_id, "tenant": tenant_id, "channel_prefix": POOL_CHANNEL_PREFIX},
            conn,
        )
        if rows:
            return Run.from_row(rows[0])
        run = await self.get(run_id, tenant_id=tenant_id, conn=conn)
        raise InvalidTransition(run_id, "redrive", run.status)

    async def get(
        self, run_id: UUID, *, tenant_id: str | None = None, conn: Conn | None = None
    ) -> Run:
        """One run; with tenant_id, only that tenant's (another's is not found)."""
        rows = await self._rows("run_get", {"id": run_id, "tenant": tenant_id}, conn)
        if not rows:
            raise RunNotFound(run_id)
        return Run.from_row(rows[0])

    async def list_runs(
        self,
        *,
        tenant_id: str | None = None,
        pool: str | None = None,
        status: RunStatus | str | None = None,
        limit: int = 50,
        before: UUID | None = None,
        conn: Conn | None = None,
    ) -> list[Run]:
        """Newest first; pass the last id of a page as `before` for the next."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValidationError("limit", f"must be between 1 and {MAX_LIST_LIMIT}")
        if status is not None:
            try:
                status = RunStatus(status)
            except ValueError:
                raise ValidationError(
                    "status", f"must be one of {', '.join(s.value for s in RunStatus)}"
                ) from None
        rows = await self._rows(
            "run_list" if tenant_id is None else "run_list_tenant",
            {
                "tenant": tenant_id,
                "pool": pool,
                "status": None if status is None else str(status),
                "before": before,
                "limit": limit,
            },
            conn,
        )
        return [Run.from_row(r) for r in rows]

    async def delete_finished(
        self, retention_s: int, *, batch: int = 1000, conn: Conn | None = None
    ) -> int:
        """Delete runs of every pool that finished more than retention_s ago
        (one batch): an operator's explicit purge. The reaper uses
        delete_expired, which follows each pool's retention_s."""
        # A zero or negative period would delete every finished run.
        if isinstance(retention_s, bool) or not isinstance(retention_s, int) or retention_s < 1:
            raise ValidationError("retention_s", "must be a whole number of seconds, at least 1")
        _check_batch(batch)
        rows = await self._rows(
            "run_retention_delete", {"retention_s": retention_s, "batch": batch}, conn
        )
        return len(rows)

    async def delete_expired(self, *, batch: int = 1000,
                             conn: Conn | None = None) -> dict[str, int]:
        """One batch of retention by each pool's retention_s (0 keeps a
        pool's runs); returns the runs deleted per pool."""
        _check_batch(batch)
        rows = await self._rows("run_retention_by_pool", {"batch": batch}, conn)
        deleted: dict[str, int] = {}
        for r in rows:
            deleted[r["pool"]] = deleted.get(r["pool"], 0) + 1
        return deleted
