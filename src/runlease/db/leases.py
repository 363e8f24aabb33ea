"""A worker's transitions of its runs: claim, ack, nack, fail, release,
finalize a cancel (statements in sql/runs.sql; the heartbeat renews the
worker's incarnation, not its runs: db/workers.py).

Every write after the claim is fenced by the lease: zero rows raises LeaseLost.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from runlease.core import bounds
from runlease.core.states import RunStatus
from runlease.db.channels import POOL_CHANNEL_PREFIX
from runlease.db.executor import Conn, stale_writes
from runlease.db.models import Lease, Run
from runlease.db.workers import WorkerStore
from runlease.errors import IncarnationEnded, LeaseLost, ValidationError


def _json(text: str) -> Any:
    return {} if text == "{}" else json.loads(text)


MAX_CLAIM_BATCH = 1000

# The columns of run_claim, in the order LeaseStore.claim reads them.
_CLAIMED = ("id", "pool", "tenant_id", "priority", "attempts", "max_attempts", "lease_epoch",
            "lease_until", "cancel_requested_at", "input_json", "budget_json", "created_at",
            "available_at", "updated_at", "thread_id")


def _held(worker: str, pairs: Sequence[tuple[UUID, int]]) -> dict[str, Any]:
    """The parameters of a statement over many of one worker's leases."""
    return {"worker": worker, "ids": [p[0] for p in pairs], "epochs": [p[1] for p in pairs]}


@dataclass(frozen=True, slots=True)
class Rendered:
    """A result already rendered by RunStore.render_result (the worker renders
    each run's result before it joins an ack batch)."""

    text: str | None


class LeaseStore(WorkerStore):
    """A worker's writes to the runs it holds, each fenced by its lease."""

    def _error(self, code: str, message: str) -> tuple[str, str]:
        """An error as stored: the code normalised (never refused: the write
        that ends a run must not fail on what agent code chose), the message
        redacted and bounded."""
        code, message = bounds.error_code(code, str(message))
        return code, self.redactor.message(message, bounds.MAX_ERROR_MESSAGE_CHARS)

    def render_result(self, result: Any) -> str | None:
        """A run's result as it will be stored: redacted, JSON, bounded.
        Raises ResultRefused (code result_not_json or result_too_large)."""
        if result is None:
            return None
        return bounds.result_text("result", result, self.max_result_bytes, self.redactor.json)

    async def claim(
        self,
        pool: str,
        worker: str,
        n: int = 1,
        *,
        conn: Conn | None = None,
    ) -> list[Lease]:
        """Lease up to n runs of the pool for the worker incarnation `worker`,
        in one short transaction. Raises IncarnationEnded when that
        incarnation is not live (it must register again)."""
        if not 1 <= n <= MAX_CLAIM_BATCH:
            raise ValidationError("n", f"must be between 1 and {MAX_CLAIM_BATCH}")
        try:
            rows = await self._tuples("run_claim", {"pool": pool, "worker": worker, "n": n},
                                      conn, names=_CLAIMED)
        except IncarnationEnded as exc:
            raise IncarnationEnded(worker) from exc
        # Built from tuples with the columns' places looked up by name once
        # per claim (_CLAIMED), JSON parsed here: measurably cheaper per
        # claimed run than dict rows and psycopg's JSON loader.
        (id_, pool_, tenant, priority, attempts, max_attempts, epoch, until, cancel, input_,
         budget, created, available, updated, thread) = range(len(_CLAIMED))
        return [
            Lease(Run(id=r[id_], pool=r[pool_], tenant_id=r[tenant], status=RunStatus.LEASED,
                      priority=r[priority], attempts=r[attempts],
                      max_attempts=r[max_attempts], lease_epoch=r[epoch],
                      locked_until=r[until], locked_by=worker, cancel_requested_at=r[cancel],
                      input_json=_json(r[input_]), budget_json=_json(r[budget]),
                      created_at=r[created], available_at=r[available],
                      updated_at=r[updated], thread_id=r[thread]), worker)
            for r in rows
        ]

    async def traceparent(self, run_id: UUID, *, conn: Conn | None = None) -> str | None:
        """The trace context the run was submitted with (tracing.py), if any:
        read by a worker that traces, apart from the claim, which stays as
        lean when tracing is off."""
        rows = await self._rows("run_traceparents", {"ids": [run_id]}, conn)
        return str(rows[0]["traceparent"]) if rows else None

    async def traceparents(self, run_ids: Sequence[UUID], *,
                           conn: Conn | None = None) -> dict[UUID, str]:
        """The trace context each of these runs was submitted with, where it
        has one (tracing.py): read by a worker that traces, once per claim
        batch, apart from the claim, which stays as lean when tracing is off."""
        rows = await self._rows("run_traceparents", {"ids": list(run_ids)}, conn)
        return {row["id"]: str(row["traceparent"]) for row in rows}

    async def ack(self, lease: Lease, result: Any = None, *, conn: Conn | None = None) -> None:
        """Finish one run. A result that cannot be stored raises ResultRefused
        and writes nothing."""
        text = self.render_result(result)
        lost = await self.ack_many([(lease, Rendered(text))], conn=conn)
        if lost:
            raise LeaseLost(lease.run_id, lease.epoch)

    async def ack_many(
        self, items: Sequence[tuple[Lease, Any]], *, conn: Conn | None = None
    ) -> set[UUID]:
        """Finish many runs of one worker in one statement; returns the ids
        whose lease was lost.

        Every result is rendered and checked first: one that cannot be stored
        ends its own run dead (result_not_json or result_too_large) instead of
        failing the batch. A result may come pre-rendered as `Rendered`."""
        if not items:
            return set()
        worker = items[0][0].worker
        if any(lease.worker != worker for lease, _ in items):
            raise ValueError("ack_many takes the leases of one worker")
        good: list[tuple[Lease, str | None]] = []
        lost: set[UUID] = set()
        for lease, result in items:
            try:
                good.append((lease, result.text if isinstance(result, Rendered)
                             else self.render_result(result)))
            except bounds.ResultRefused as exc:
                try:
                    await self.fail(lease, exc.code, f"the run's result {exc.message}",
                                    conn=conn)
                except LeaseLost:
                    lost.add(lease.run_id)
        if not good:
            return lost
        rendered = [text for _, text in good]
        # A batch of no-op runs has nothing to send: one NULL instead of an array.
        results = None if all(r is None for r in rendered) else rendered
        rows = await self._rows(
            "run_ack",
            {
                "worker": worker,
                "ids": [lease.run_id for lease, _ in good],
                "epochs": [lease.epoch for lease, _ in good],
                "results": results,
                "channel_prefix": POOL_CHANNEL_PREFIX,
            },
            conn,
        )
        done = {r["id"] for r in rows}
        for lease, _ in good:
            if lease.run_id not in done:
                lost.add(lease.run_id)
                stale_writes(lease.run.pool)
        return lost

    async def nack(
        self,
        lease: Lease,
        error_code: str,
        error_message: str,
        *,
        retry_after_s: float | None = None,
        conn: Conn | None = None,
    ) -> RunStatus:
        """A retryable failure; returns where the run went (pending, dead or cancelled)."""
        code, message = self._error(error_code, error_message)
        if retry_after_s is not None and not 0 <= retry_after_s <= bounds.RETRY_AFTER_MAX_S:
            raise ValidationError("retry_after_s",
                                  f"must be between 0 and {bounds.RETRY_AFTER_MAX_S}")
        rows = await self._fenced("run_nack", lease, {
            "error_code": code, "error_message": message, "retry_after_s": retry_after_s,
        }, conn)
        return RunStatus(rows[0]["status"])

    async def fail(
        self, lease: Lease, error_code: str, error_message: str, *, conn: Conn | None = None
    ) -> None:
        """A fatal failure: dead now."""
        code, message = self._error(error_code, error_message)
        await self._fenced("run_fail", lease, {"error_code": code, "error_message": message},
                           conn)

    async def release(
        self, worker: str, leases: Iterable[tuple[UUID, int]], *, conn: Conn | None = None
    ) -> dict[UUID, RunStatus]:
        """Drain: hand leases back without charging the attempt. Returns the
        new status of each run still held; the others' leases were lost."""
        pairs = list(leases)
        if not pairs:
            return {}
        rows = await self._rows(
            "run_release", _held(worker, pairs) | {"channel_prefix": POOL_CHANNEL_PREFIX}, conn)
        return {r["id"]: RunStatus(r["status"]) for r in rows}

    async def finalize_cancel(self, lease: Lease, *, conn: Conn | None = None) -> float:
        """The run is cancelled; returns seconds since the cancel was requested."""
        rows = await self._fenced("run_finalize_cancel", lease, {}, conn)
        return max(0.0, float(rows[0]["latency_s"]))
