"""Schedules: cron ticks that enqueue runs from a template (statements in
sql/schedules.sql; the leader's loop is services/scheduler.py).

A due tick is enqueued in the transaction that moves the schedule's
next_tick_at on, with the schedule's row locked (SKIP LOCKED for other
schedulers) and an idempotency key per tick: a leader change, or two
processes that both believe they lead, never enqueue a tick twice, and a
tick is never lost to a crash between the enqueue and the move (they commit
together). Catch-up: when ticks were missed (no leader for a while), only
the latest missed tick is enqueued; the earlier ones are skipped and
counted."""

from __future__ import annotations

import re
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from runlease.core import bounds
from runlease.core.backoff import RetryPolicy
from runlease.core.cron import Cron
from runlease.core.ids import uuid7
from runlease.core.schedule_fields import ScheduleFields
from runlease.core.states import TERMINAL
from runlease.db.executor import Conn
from runlease.db.keyed import Keyed, KeyedStore
from runlease.db.models import _pick
from runlease.db.rates import RateStore, Throttled
from runlease.db.runs import NewRun
from runlease.db.webhooks import WebhookStore
from runlease.errors import (
    IdempotencyConflict,
    RunleaseError,
    RunNotFound,
    ThreadBusy,
    UnknownPool,
    ValidationError,
)

SCHEDULES_PER_TENANT_MAX = 100
SCHEDULE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$"
_NAME_RE = re.compile(SCHEDULE_NAME_PATTERN)
Overlap = Literal["skip", "allow"]


class ScheduleNotFound(RunNotFound):
    """No such schedule (or another tenant's): a 404 like a missing run."""


@dataclass(frozen=True, slots=True)
class Schedule(ScheduleFields):
    """A schedule as stored: the fields the API shows, and the pool of its
    template (a column, for the pool's schedules)."""

    pool: str = field(kw_only=True)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Schedule:
        return cls(**_pick(cls, dict(row)))


@dataclass(frozen=True, slots=True)
class Tick:
    """What one due schedule did."""

    schedule_id: UUID
    tenant_id: str
    tick: datetime
    run_id: UUID | None  # None: nothing enqueued (see error)
    missed: int  # earlier ticks skipped by the catch-up rule
    error: str | None = None


def new_run(tenant_id: str, template: Mapping[str, Any], key: str | None) -> NewRun:
    """The run a template describes (the submit body's run fields)."""
    retry = RetryPolicy(template.get("backoff_base_s"), template.get("backoff_cap_s"),
                        tuple(codes) if (codes := template.get("non_retryable_codes"))
                        is not None else None)
    return NewRun(tenant_id, template.get("input", {}), template.get("priority", 0),
                  template.get("max_attempts"), template.get("budget"), key,
                  labels=template.get("labels"), retry=retry)


def _keyed(template: Mapping[str, Any]) -> Keyed | None:
    """The template's thread or key, or None (also for one no longer valid:
    its tick is then refused, and says why, in _fire)."""
    try:
        return Keyed.of(template)
    except ValidationError:
        return None


def tick_key(schedule_id: UUID, tick: datetime) -> str:
    return f"schedule:{schedule_id}:{tick.isoformat()}"


class ScheduleStore(KeyedStore, RateStore, WebhookStore):
    async def create_schedule(
        self, tenant_id: str, name: str, cron: Cron, template: Mapping[str, Any], *,
        overlap: Overlap = "skip", paused: bool = False, conn: Conn | None = None,
    ) -> Schedule:
        """A new schedule; at most SCHEDULES_PER_TENANT_MAX per tenant, names
        unique per tenant. The template is checked as a submit would be."""
        bounds.check_tenant(tenant_id)
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValidationError("name", f"must match {SCHEDULE_NAME_PATTERN}")
        if overlap not in ("skip", "allow"):
            raise ValidationError("overlap", "must be skip or allow")
        pool = template.get("pool", "default")
        bounds.check_pool(pool)
        run = new_run(tenant_id, template, None)
        # As enqueue would check it, so a bad template is a 422 now, not a
        # failed tick later.
        bounds.check_priority(run.priority)
        if run.max_attempts is not None:
            bounds.check_max_attempts(run.max_attempts)
        bounds.check_object("template.input", run.input, self.max_input_bytes)
        bounds.Budget.parse(run.budget)
        Keyed.of(template)  # a thread, a key, a singleton or a debounce, in its form
        if run.retry is not None:
            RetryPolicy.checked(run.retry.backoff_base_s, run.retry.backoff_cap_s,
                                run.retry.non_retryable_codes)
        text = bounds.json_text("template", dict(template), self.max_input_bytes)
        async with self.connection(conn) as c, c.transaction():
            if not await self._rows("pool_get", {"name": pool}, c):
                raise UnknownPool(pool)  # a 404, as for a submit
            if template.get("webhook_url") is not None:
                await self.check_webhook_url(template["webhook_url"], conn=c)
            (clock,) = await self._rows("schedule_lock_tenant", {"tenant": tenant_id}, c)
            rows = await self._rows("schedule_create", {
                "id": uuid7(), "tenant": tenant_id, "name": name, "cron": cron.expr,
                "timezone": cron.timezone, "pool": pool, "template": text, "overlap": overlap,
                "paused": paused, "next_tick_at": cron.next_after(clock["now"]),
                "max": SCHEDULES_PER_TENANT_MAX}, c)
            if rows:
                return Schedule.from_row(rows[0])
            (count,) = await self._rows("schedule_count", {"tenant": tenant_id, "name": name},
                                        c)
            if count["named"]:
                raise ScheduleExists(name)
            raise ValidationError("name", f"this tenant already has {count['n']} schedules, "
                                          f"the most it may have ({SCHEDULES_PER_TENANT_MAX})")

    async def get_schedule(self, schedule_id: UUID, *, tenant_id: str | None = None,
                           conn: Conn | None = None) -> Schedule:
        rows = await self._rows("schedule_get", {"id": schedule_id, "tenant": tenant_id}, conn)
        if not rows:
            raise ScheduleNotFound(schedule_id)
        return Schedule.from_row(rows[0])

    async def list_schedules(self, *, tenant_id: str | None = None, limit: int = 50,
                             after: tuple[str, str] | None = None,
                             conn: Conn | None = None) -> list[Schedule]:
        """By tenant, then name; pass the last one's (tenant_id, name) as `after`."""
        if not 1 <= limit <= 500:
            raise ValidationError("limit", "must be between 1 and 500")
        rows = await self._rows("schedule_list", {
            "tenant": tenant_id, "limit": limit, "after_tenant": after[0] if after else None,
            "after_name": after[1] if after else None}, conn)
        return [Schedule.from_row(r) for r in rows]

    async def set_schedule_paused(self, schedule_id: UUID, paused: bool, *,
                                  tenant_id: str | None = None,
                                  conn: Conn | None = None) -> Schedule:
        """Pause, or resume from the next tick after now (no catch-up of the pause)."""
        async with self.connection(conn) as c, c.transaction():
            current = await self.get_schedule(schedule_id, tenant_id=tenant_id, conn=c)
            (clock,) = await self._rows("schedule_clock", {}, c)
            cron = Cron(current.cron, current.timezone)
            rows = await self._rows("schedule_set_paused", {
                "id": schedule_id, "tenant": tenant_id, "paused": paused,
                "next_tick_at": cron.next_after(clock["now"])}, c)
        if not rows:
            raise ScheduleNotFound(schedule_id)
        return Schedule.from_row(rows[0])

    async def delete_schedule(self, schedule_id: UUID, *, tenant_id: str | None = None,
                              conn: Conn | None = None) -> None:
        """Delete it; the runs it enqueued stay."""
        if not await self._rows("schedule_delete", {"id": schedule_id, "tenant": tenant_id},
                                conn):
            raise ScheduleNotFound(schedule_id)

    async def fire_due_schedules(self, *, batch: int = 100,
                                 conn: Conn | None = None) -> list[Tick]:
        """Enqueue the due tick of at most `batch` schedules, in one
        transaction; then stop the runs their ticks interrupted (a thread's
        multitask interrupt or rollback, a singleton's cancel_in_progress)."""
        ticks: list[Tick] = []
        interrupts: list[tuple[UUID, str]] = []
        async with self.connection(conn) as c, c.transaction():
            rows = await self._rows("schedule_due", {"batch": batch}, c)
            # Their threads' and keys' rows first, in one order (db/keyed.py).
            await self.lock_keyed(
                [(row["pool"], row["tenant_id"], k) for row in rows
                 if (k := _keyed(row["template"])) is not None], conn=c)
            for row in rows:
                ticks.append(await self._fire(row, c, interrupts))
        for run_id, tenant_id in interrupts:
            with suppress(RunleaseError):  # it finished meanwhile: nothing to stop
                await self.interrupt(run_id, tenant_id, conn=conn)
        return ticks

    async def _fire(self, row: Mapping[str, Any], c: Conn,
                    interrupts: list[tuple[UUID, str]]) -> Tick:
        schedule = Schedule.from_row(row)
        now: datetime = row["now"]
        cron = Cron(schedule.cron, schedule.timezone)
        tick = max(cron.latest_at_or_before(now), schedule.next_tick_at)
        missed = 0
        probe = schedule.next_tick_at
        while probe < tick and missed < 10_000:  # count the skipped ticks, bounded
            missed += 1
            probe = cron.next_after(probe)
        run_id: UUID | None = None
        error: str | None = None
        last_status = row.get("last_run_status")
        if (schedule.overlap == "skip" and last_status is not None
                and last_status not in {s.value for s in TERMINAL}):
            error = f"skipped: the previous tick's run {schedule.last_run_id} is {last_status}"
        else:
            try:
                # A savepoint: a refused enqueue must not undo the advance.
                async with c.transaction():
                    # A tick is a submit of the tenant's: its rate and queue
                    # quota count it, as they count the API's (issue 32).
                    await self.admit_all(schedule.pool, schedule.tenant_id, 1, conn=c)
                    joined = await self.submit_keyed(
                        schedule.pool,
                        new_run(schedule.tenant_id, schedule.template,
                                tick_key(schedule.id, tick)),
                        Keyed.of(schedule.template), conn=c)
                    result = joined.result
                    if joined.interrupt is not None:
                        interrupts.append((joined.interrupt, schedule.tenant_id))
                    url = schedule.template.get("webhook_url")
                    if url is not None and result.inserted:
                        # Checked again: the admin may have taken the host
                        # off the allowlist since (the tick is then refused).
                        await self.add_webhook(
                            result.run.id, schedule.tenant_id,
                            await self.check_webhook_url(url, conn=c), conn=c)
                run_id = result.run.id
            except (ValidationError, IdempotencyConflict, Throttled, ThreadBusy) as exc:
                # The pool was deleted, the tenant's band moved, the tenant
                # is over its rate or quota, it took the tick's key, or the
                # thread is busy (multitask reject): say so on the schedule.
                error = f"not enqueued: {exc}"[:1024]
        await self._rows("schedule_advance", {
            "id": schedule.id, "next_tick_at": cron.next_after(now), "tick": tick,
            "run_id": run_id, "error": error}, c)
        return Tick(schedule.id, schedule.tenant_id, tick, run_id, missed, error)


class ScheduleExists(RunleaseError):
    """The tenant already has a schedule of that name: a 409."""

    def __init__(self, name: str) -> None:
        super().__init__(f"this tenant already has a schedule named {name!r}")
