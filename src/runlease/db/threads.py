"""Threads (statements in sql/threads.sql, migration 0017): at most one run
of a tenant's thread is active; the others wait in submit order.

    submit    lock the thread's row; insert the run; it joins the thread:
              the head if the thread is idle, parked behind the head otherwise
    advance   the head finishes -> the next parked run is the head, due
              (runlease_thread_advance, a trigger: every way a run ends)
    claim     only a thread's head is in the claim's indexes; the claim's
              stage `threads` drops any other (runlease_claim_threads)

A submit to a thread with a head follows its multitask policy: `enqueue`
waits its turn, `reject` refuses (ThreadBusy, naming the head), `interrupt`
asks the head to stop (after the submit commits: see `interrupt`),
`rollback` does so and flags the head `rolled_back`, and `steer` makes no
run: the submit's input goes into the head's inbox as a message (issue 28),
in the same transaction, under the thread's lock (the head cannot finish
meanwhile), and the answer is the head.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from runlease.core import bounds
from runlease.db.executor import Conn
from runlease.db.humans import HumanStore
from runlease.db.models import EnqueueResult, FromRow, Run
from runlease.db.runs import NewRun, QueueStore
from runlease.errors import ThreadBusy, ValidationError

MAX_THREAD_PAGE = 500


class Multitask(StrEnum):
    """What a submit does to a thread that already has an unfinished run."""

    ENQUEUE = "enqueue"
    REJECT = "reject"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"
    STEER = "steer"


@dataclass(frozen=True, slots=True, kw_only=True)
class Thread(FromRow):
    """A tenant's thread as GET /v1/threads/{id} shows it."""

    tenant_id: str
    thread_id: str
    head_run_id: UUID | None  # the active run, or the next to start; None: idle
    head_status: str | None
    runs: int  # submitted to it, ever
    latest_run_id: UUID | None  # the newest done run not rolled back
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ThreadSubmit:
    """A submit's outcome; `interrupt`: the run to stop once it committed."""

    result: EnqueueResult
    interrupt: UUID | None = None
    steered: int | None = None  # steer: the message's seq in the head's inbox


class ThreadStore(HumanStore, QueueStore):
    """A tenant's threads: submit into one, read one, list its runs."""

    async def submit_to_thread(self, pool: str, run: NewRun, thread_id: str,
                               multitask: Multitask | str = Multitask.ENQUEUE, *,
                               conn: Conn) -> ThreadSubmit:
        """Enqueue `run` into its tenant's thread, in the caller's transaction
        on `conn` (commit it, then call `interrupt` with what is returned).
        A repeated idempotency key answers the existing run and changes nothing."""
        thread = bounds.check_thread(thread_id)
        policy = _policy(multitask)
        tenant = bounds.check_tenant(run.tenant_id)
        (lock,) = await self._rows("thread_lock", {"tenant": tenant, "thread": thread}, conn)
        head: UUID | None = lock["head_run_id"]
        if head is not None and policy is Multitask.STEER:
            text, data = steer_message(run.input)
            seq, _ = await self.send_message(head, text, data, tenant_id=tenant, conn=conn)
            return ThreadSubmit(EnqueueResult(await self.get(head, conn=conn), False),
                                steered=seq)
        (result,) = await self.enqueue_many(pool, [run], notify=False, conn=conn)
        if not result.inserted:
            return ThreadSubmit(result)
        if head is not None and policy is Multitask.REJECT:
            # Read now: thread_lock's snapshot may predate the head's commit.
            raise ThreadBusy(thread, head, (await self.get(head, conn=conn)).status)
        rows = await self._rows("thread_join", {"id": result.run.id, "tenant": tenant,
                                                "thread": thread}, conn)
        joined = EnqueueResult(Run.from_row(rows[0]), True)
        if head is not None and policy in (Multitask.INTERRUPT, Multitask.ROLLBACK):
            if policy is Multitask.ROLLBACK:
                await self._rows("thread_flag_rolled_back", {"id": head, "tenant": tenant},
                                 conn)
            return ThreadSubmit(joined, head)
        return ThreadSubmit(joined)

    async def interrupt(self, run_id: UUID, tenant_id: str, *, conn: Conn | None = None) -> Run:
        """Stop the run a submit interrupted: a pending one is cancelled at
        once (its thread's next run becomes the head), a leased one is asked
        to stop at its next safe point (its tools are killed, its committed
        steps kept) and the next run starts when it has ended. Run after the
        submit commits and outside its transaction: a finish of that run
        locks the run and then its thread, the submit the other way round."""
        return await self.request_cancel(run_id, tenant_id=tenant_id, conn=conn)

    async def get_thread(self, tenant_id: str, thread_id: str, *,
                         conn: Conn | None = None) -> Thread | None:
        """A tenant's thread (another tenant's is None, as one never used)."""
        rows = await self._rows("thread_get", {"tenant": bounds.check_tenant(tenant_id),
                                               "thread": bounds.check_thread(thread_id)}, conn)
        return Thread.from_row(rows[0]) if rows else None

    async def thread_runs(self, tenant_id: str, thread_id: str, *, after: int = 0,
                          limit: int = 50, conn: Conn | None = None) -> list[Run]:
        """A thread's runs in submit order (`thread_seq`), after `after`."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not (
                1 <= limit <= MAX_THREAD_PAGE):
            raise ValidationError("limit", f"must be between 1 and {MAX_THREAD_PAGE}")
        params: dict[str, Any] = {"tenant": bounds.check_tenant(tenant_id),
                                  "thread": bounds.check_thread(thread_id),
                                  "after": after, "limit": limit}
        return [Run.from_row(r) for r in await self._rows("thread_runs", params, conn)]


def steer_message(run_input: Any) -> tuple[str, dict[str, Any] | None]:
    """A steering submit's input as a message: its `text` or `message` (a
    string), else the input as JSON text; the input itself as its data."""
    if isinstance(run_input, dict):
        for name in ("text", "message"):
            if isinstance(run_input.get(name), str):
                return run_input[name], dict(run_input)
    return json.dumps(run_input, separators=(",", ":"))[:4096], (
        dict(run_input) if isinstance(run_input, dict) else None)


def _policy(value: Multitask | str) -> Multitask:
    try:
        return Multitask(value)
    except ValueError:
        raise ValidationError("multitask", "must be one of "
                              + ", ".join(m.value for m in Multitask)) from None
