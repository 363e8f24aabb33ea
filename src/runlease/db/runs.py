"""The run queue outside a worker's lease: enqueue, read, cancel, redrive,
reap and retention (statements in sql/runs.sql)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from runlease.core import bounds, run_options
from runlease.core.backoff import RetryPolicy
from runlease.core.ids import uuid7
from runlease.core.states import RunStatus
from runlease.db.channels import CANCEL_CHANNEL, POOL_CHANNEL_PREFIX
from runlease.db.enqueue_explain import Explainer
from runlease.db.executor import Conn, Executor
from runlease.db.models import EnqueueResult, ReapResult, Run
from runlease.db.run_search import RunFilter, SearchStore
from runlease.errors import (
    BatchConflict,
    BatchRefused,
    IdempotencyConflict,
    InvalidTransition,
    ItemError,
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


def _js(value: object) -> str:
    return "null" if value is None else json.dumps(value)


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
        """The statement's parameters: the runs as one JSON array (values
        validated, texts spliced in as checked), and what was refused."""
        cols: dict[str, list[Any]] = {k: [] for k in (
            "ids", "pools", "tenants", "priorities", "keys")}
        docs: list[str] = []
        errors: list[tuple[int, ValidationError]] = []
        seen_keys: set[tuple[str, str, str]] = set()
        now = datetime.now(UTC) if (db_now := self.clock.db_now()) is None else db_now
        dumps = json.dumps
        heads: dict[tuple[str, str, int | None, RetryPolicy], str] = {}
        checked_labels: dict[tuple[tuple[Any, Any], ...] | None, str | None] = {}
        for i, run in enumerate(runs):
            where = f"runs[{i}]." if len(runs) > 1 else ""
            try:
                run_pool = pool if run.pool is None else bounds.check_pool(run.pool)
                tenant = bounds.check_tenant(run.tenant_id)
                priority = bounds.check_priority(run.priority)
                attempts = (None if run.max_attempts is None
                            else bounds.check_max_attempts(run.max_attempts))
                budget = (bounds.json_text("budget", bounds.Budget.parse(run.budget).to_json(),
                                           self.max_input_bytes)
                          if run.budget is not None else "{}")
                input_text = bounds.check_object("input", run.input, self.max_input_bytes)
                seen = None
                try:  # a batch's runs often share their labels: checked once
                    seen = None if run.labels is None else tuple(run.labels.items())
                    labels = checked_labels[seen]
                except (KeyError, TypeError, AttributeError):
                    labels = run_options.check_labels(run.labels)
                    if seen is not None:
                        checked_labels[seen] = labels
                run_at, delay_s = run_options.check_start(run.run_at, run.delay_s, now)
                key = run.idempotency_key
                if key is not None:
                    bounds.check_idempotency_key(key)
                    if (run_pool, tenant, key) in seen_keys:
                        raise ValidationError("idempotency_key", "repeated within one batch")
                    seen_keys.add((run_pool, tenant, key))
                retry = RetryPolicy() if run.retry is None else RetryPolicy.checked(
                    run.retry.backoff_base_s, run.retry.backoff_cap_s,
                    run.retry.non_retryable_codes)
            except ValidationError as exc:
                errors.append((i, ValidationError(where + exc.field, exc.message)
                               if len(runs) == 1 else exc))
                continue
            run_id = uuid7()
            # Texts repeated across a batch (pool, tenant, retry policy) are
            # dumped once: json.dumps was 11 calls a run, a third of a batch.
            head = heads.get((run_pool, tenant, attempts, retry))
            if head is None:
                head = heads[run_pool, tenant, attempts, retry] = (
                    f'"pool":{dumps(run_pool)},"tenant_id":{dumps(tenant)},'
                    f'"max_attempts":{_js(attempts)},'
                    f'"backoff_base_s":{_js(retry.backoff_base_s)},'
                    f'"backoff_cap_s":{_js(retry.backoff_cap_s)},'
                    f'"non_retryable_codes":{_js(retry.non_retryable_codes)}')
            docs.append(
                f'{{"ord":{i},"id":"{run_id}",{head},"priority":{priority},'
                f'"budget_json":{budget},"input_json":{input_text},'
                f'"idempotency_key":{_js(key)},"labels":{labels or "null"},'
                f'"run_at":{"null" if run_at is None else dumps(run_at.isoformat())},'
                f'"delay_s":{_js(delay_s)}}}')
            for column, value in zip(cols.values(), (run_id, run_pool, tenant, priority, key),
                                     strict=True):
                column.append(value)
        return {**cols, "runs": "[" + ",".join(docs) + "]",
                "channel_prefix": POOL_CHANNEL_PREFIX}, errors

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
        by_id = {r["id"]: r for r in rows}
        outcomes: list[EnqueueResult | RunleaseError] = []
        explain = Explainer(self, c)
        for run_id, pool, tenant, key, priority in zip(
                params["ids"], params["pools"], params["tenants"], params["keys"],
                params["priorities"], strict=True):
            row = by_id.get(run_id) or (by_key.get((pool, tenant, key)) if key else None)
            if row is not None:
                outcomes.append(EnqueueResult(Run.from_row(row), bool(row["inserted"])))
                continue
            exc = await explain.why(pool, tenant, key, priority)
            if exc is None:
                raise RunleaseError(f"enqueue returned no row for run {run_id}")
            outcomes.append(exc)
        return outcomes

    async def _results(self, runs: Sequence[NewRun], params: dict[str, Any],
                       rows: list[Any], c: Conn | None) -> list[EnqueueResult]:
        results: list[EnqueueResult] = []
        refused: list[ItemError] = []
        conflicts: list[IdempotencyConflict] = []
        for i, outcome in enumerate(await self._outcomes(params, rows, c)):
            if isinstance(outcome, EnqueueResult):
                results.append(outcome)
                continue
            if len(runs) == 1:
                raise outcome  # rolls back
            if isinstance(outcome, IdempotencyConflict):
                conflicts.append(outcome)
                refused.append(ItemError(i, "idempotency_conflict", "idempotency_key",
                                         str(outcome)))
            else:
                assert isinstance(outcome, ValidationError)
                code = "unknown_pool" if isinstance(outcome, UnknownPool) else "invalid_request"
                refused.append(ItemError(i, code, outcome.field, outcome.message))
        if refused:  # rolls the batch back
            if conflicts and len(conflicts) == len(refused):
                raise BatchConflict(refused, conflicts[0])
            raise BatchRefused(refused)
        return results

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
