"""The run queue outside a worker's lease: enqueue, read, cancel, redrive,
reap and retention (statements in sql/runs.sql)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from runlease.core import bounds
from runlease.core.backoff import RetryPolicy
from runlease.core.states import RunStatus
from runlease.db.channels import CANCEL_CHANNEL, POOL_CHANNEL_PREFIX
from runlease.db.enqueue_explain import enqueue_outcomes
from runlease.db.enqueue_params import enqueue_params, refuse
from runlease.db.executor import Conn, Executor
from runlease.db.models import EnqueueResult, ReapResult, Run
from runlease.db.run_search import RunFilter, SearchStore
from runlease.errors import (
    BatchRefused,
    InvalidTransition,
    ItemError,
    RunleaseError,
    RunNotFound,
    ValidationError,
)

MAX_BATCH = 10_000  # reap and retention
MAX_LIST_LIMIT = 500


def _check_batch(batch: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise ValidationError("batch", f"must be between 1 and {MAX_BATCH}")


# Not frozen: a frozen dataclass's __init__ sets each of its 12 fields
# through object.__setattr__, 2 us a run of a batch of 1,000 (a run holds
# its input, a dict, so it was never hashable either).
@dataclass(slots=True)
class NewRun:
    """One run to enqueue; `max_attempts` None takes the pool's default,
    `pool` None the batch's. `run_at` or `delay_s` (not both) hold it back."""

    tenant_id: str
    input: Mapping[str, Any]
    priority: int = 0
    max_attempts: int | None = None
    budget: Mapping[str, Any] | None = None
    idempotency_key: str | None = None
    labels: Mapping[str, str] | None = None
    run_at: datetime | None = None
    delay_s: float | None = None
    pool: str | None = None
    retry: RetryPolicy | None = None  # checked by RetryPolicy.checked
    # The input was parsed from JSON text (only JSON's types in it): checked
    # by bounds.check_parsed_object, quicker to write (the API's batches).
    input_parsed: bool = False
    # The W3C trace context to store (tracing.parse_traceparent made it).
    traceparent: str | None = None


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
        labels: Mapping[str, str] | None = None,
        run_at: datetime | None = None,
        delay_s: float | None = None,
        notify: bool = True,
        retry: RetryPolicy | None = None,
        conn: Conn | None = None,
    ) -> EnqueueResult:
        run = NewRun(tenant_id, input, priority, max_attempts, budget, idempotency_key,
                     labels, run_at, delay_s, retry=retry)
        (result,) = await self.enqueue_many(pool, [run], notify=notify, conn=conn)
        return result

    async def enqueue_many(
        self, pool: str, runs: Sequence[NewRun], *, notify: bool = True,
        conn: Conn | None = None
    ) -> list[EnqueueResult]:
        """Enqueue a batch in one INSERT; results in the order given.

        All or nothing: an invalid item, an unknown pool, a priority outside
        the tenant's band or an idempotency key reused with another input
        writes none of the batch. A batch of several raises BatchRefused,
        which names every refused item by index; a single run raises the
        item's own error (UnknownPool, ValidationError, IdempotencyConflict).
        `notify` False leaves waking the pools' claimers to the caller, after
        the commit (see api/wakeups.py): a NOTIFY inside the transaction
        serializes all notifying commits on the server.
        """
        bounds.check_pool(pool)
        if not runs:
            return []
        params, errors = self._enqueue_params(pool, runs)
        params["notify"] = notify
        if errors:
            raise errors[0][1] if len(runs) == 1 else BatchRefused([
                ItemError(i, "invalid_request", e.field, e.message) for i, e in errors])
        if len(runs) == 1 and conn is None:
            # One statement, its own transaction: one round trip, the submit's hot path.
            rows = await self._rows("run_enqueue", params)
            return await self._results(runs, params, rows, None)
        async with self.connection(conn) as c, c.transaction():
            rows = await self._rows("run_enqueue", params, c)
            return await self._results(runs, params, rows, c)

    def _enqueue_params(self, pool: str, runs: Sequence[NewRun]
                        ) -> tuple[dict[str, Any], list[tuple[int, ValidationError]]]:
        now = datetime.now(UTC) if (db_now := self.clock.db_now()) is None else db_now
        return enqueue_params(pool, runs, now, self.max_input_bytes)

    async def enqueue_each(self, runs: Sequence[NewRun], *,
                           conn: Conn) -> list[EnqueueResult | RunleaseError]:
        """Enqueue runs that are not a batch (concurrent single submits, see
        api/submit_group.py) in one INSERT on `conn`, in its transaction:
        each run's own result or error, in the order given, as if each had
        been enqueued alone. A refused run (invalid, unknown pool, priority
        outside the band, idempotency conflict) writes nothing and fails no
        other. Runs name their pool; no two may share an idempotency key."""
        outcomes: list[EnqueueResult | RunleaseError | None] = [None] * len(runs)
        if not runs:
            return []
        params, errors = self._enqueue_params(runs[0].pool or "", runs)
        for i, exc in errors:  # the single submit's error, field unprefixed
            outcomes[i] = ValidationError(exc.field, exc.message)
        valid = [i for i in range(len(runs)) if outcomes[i] is None]
        if valid:
            rows = await self._rows("run_enqueue", params | {"notify": False}, conn)
            for i, outcome in zip(valid, await self._outcomes(params, rows, conn), strict=True):
                outcomes[i] = outcome
        return [o for o in outcomes if o is not None]

    async def _outcomes(self, params: dict[str, Any], rows: list[Any],
                        c: Conn | None) -> list[EnqueueResult | RunleaseError]:
        """Each valid run's result, or why the insert returned no row for it."""
        by_key = {(r["pool"], r["tenant_id"], r["idempotency_key"]): r for r in rows}
        by_id = {str(r["id"]): r for r in rows}

        def found(run_id: Any, pool: str, tenant: str, key: str | None) -> EnqueueResult | None:
            row = by_id.get(run_id) or (by_key.get((pool, tenant, key)) if key else None)
            return None if row is None else EnqueueResult(Run.from_row(row),
                                                          bool(row["inserted"]))

        return await enqueue_outcomes(self, c, params, found)

    async def _results(self, runs: Sequence[NewRun], params: dict[str, Any],
                       rows: list[Any], c: Conn | None) -> list[EnqueueResult]:
        outcomes = await self._outcomes(params, rows, c)
        refuse(len(runs), outcomes)
        return [o for o in outcomes if isinstance(o, EnqueueResult)]

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

    async def reap(self, *, batch: int = 1000, conn: Conn | None = None) -> ReapResult:
        """One bounded batch: worker incarnations that expired end, and the
        runs of every holder that can no longer renew go back to pending (or
        dead / cancelled)."""
        _check_batch(batch)
        rows = await self._rows(
            "run_reap", {"batch": batch, "channel_prefix": POOL_CHANNEL_PREFIX}, conn)
        counts = {s: 0 for s in ("pending", "dead", "cancelled")}
        runs = [r for r in rows if r["id"] is not None]
        for r in runs:
            counts[r["status"]] += 1
        return ReapResult(
            to_pending=counts["pending"],
            to_dead=counts["dead"],
            to_cancelled=counts["cancelled"],
            reaped=tuple((r["id"], r["pool"], r["tenant_id"], r["status"]) for r in runs),
            ended=tuple(r["ended"] for r in rows if r["ended"] is not None),
        )

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
        """Newest first; pass the last id of a page as `before` for the next.
        More filters: RunStore.search with a RunFilter."""
        f = RunFilter(tenant_id=tenant_id, pool=pool,
                      statuses=() if status is None else (status,))  # type: ignore[arg-type]
        return await SearchStore.search(self, f, limit=limit,  # type: ignore[arg-type]
                                        before=before, conn=conn)

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
