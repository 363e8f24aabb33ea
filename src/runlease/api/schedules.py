"""/v1/schedules: cron schedules that enqueue a run per tick (issue 15).

A tenant sees and changes its own schedules only (another's is a 404); an
admin names the tenant when creating one. The leader enqueues the ticks
(services/scheduler.py)."""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any, Literal
from uuid import UUID
from zoneinfo import available_timezones

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field, JsonValue, StrictBool
from pydantic.dataclasses import dataclass as pydantic_dataclass

from runlease.api.deps import JsonBody, Store, Who
from runlease.api.errors import ErrorAnswer
from runlease.api.routes import tenant_for
from runlease.api.schemas import (
    WEBHOOK_URL_PATTERN,
    ErrorBody,
    KeyedSettings,
    Strict,
    TenantId,
    described,
)
from runlease.core.cron import CRON_MAX_CHARS, TIMEZONE_PATTERN, Cron
from runlease.core.schedule_fields import ScheduleFields
from runlease.db.schedules import (
    SCHEDULE_NAME_PATTERN,
    Schedule,
    ScheduleExists,
    ScheduleNotFound,
)

router = APIRouter(prefix="/v1", tags=["schedules"])


def _field(n: str) -> str:
    item = rf"(?:\*|{n}(?:-{n})?)(?:/[1-9][0-9]?)?"
    return rf"{item}(?:,{item})*"


# The standard cron grammar, each field within its range.
# Fields apart by spaces and tabs only, as core/cron.py reads them (issue 32:
# `\s` let \v, \f and \r through, which the parser did not take).
CRON_PATTERN = (r"^[ \t]*" + r"[ \t]+".join(_field(n) for n in (
    r"[0-5]?[0-9]", r"(?:[01]?[0-9]|2[0-3])", r"(?:0?[1-9]|[12][0-9]|3[01])",
    r"(?:0?[1-9]|1[0-2])", r"[0-7]")) + r"[ \t]*$")
ZONES: list[JsonValue] = [*sorted(available_timezones())]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such schedule (or another tenant's)."}}


class RunTemplate(KeyedSettings):
    """The run each tick enqueues: the fields of a submit (`POST /v1/runs`),
    its thread, concurrency key, singleton or debounce included."""

    webhook_url: str | None = Field(
        None, min_length=1, max_length=2048, pattern=WEBHOOK_URL_PATTERN,
        examples=["https://hooks.example.com/runlease"],
        description="Each tick's run is POSTed a signed notice when it finishes; the host "
                    "must be on the admin's webhook allowlist (403 otherwise), when the "
                    "schedule is made and at each tick.")


class ScheduleIn(Strict):
    """A schedule: a cron expression in a time zone, and the run to enqueue
    at each tick. A tenant may have at most 100 schedules."""

    name: str = Field(pattern=SCHEDULE_NAME_PATTERN, min_length=1, max_length=64,
                      description="Unique within the tenant.", examples=["nightly-eval"])
    cron: str = Field(min_length=9, max_length=CRON_MAX_CHARS, pattern=CRON_PATTERN,
                      description="Five fields: minute hour day-of-month month day-of-week "
                                  "(numbers, `*`, ranges `a-b`, steps `/n`, lists `a,b`); a "
                                  "range runs low to high, and a day must exist in some "
                                  "month the expression allows.",
                      examples=["30 2 * * *"])
    timezone: str = Field("UTC", min_length=1, max_length=64, pattern=TIMEZONE_PATTERN,
                          description="An IANA time zone the cron expression is read in.",
                          examples=["Europe/Berlin"],
                          json_schema_extra={"enum": ZONES})
    template: RunTemplate
    overlap: Literal["skip", "allow"] = Field(
        "skip", description="skip: no run for a tick while the previous tick's run is not "
                            "finished; allow: a run for every tick.")
    paused: StrictBool = False
    tenant_id: TenantId | None = Field(
        None, description="The tenant the schedule belongs to. An admin token must name it; "
                          "a tenant token may leave it out or name its own tenant (another "
                          "tenant's is refused with 403).")


# The fields are core/schedule_fields.py's, which the clients' ScheduleView
# reads back: declared once for the server, the clients and this document.
@pydantic_dataclass(frozen=True, config=described({
    "next_tick_at": {"description": "The next tick to enqueue."},
    "last_run_id": {"description": "The run of the latest enqueued tick."},
    "last_error": {"description": "Why the latest due tick enqueued nothing (overlap, a "
                                  "refused template)."},
}))
class ScheduleOut(ScheduleFields):
    """A schedule: its cron, its run template and its latest tick."""

    @classmethod
    def of(cls, s: Schedule) -> ScheduleOut:
        return cls(**{f.name: getattr(s, f.name) for f in fields(ScheduleFields)})


class SchedulePage(BaseModel):
    items: list[ScheduleOut]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page.")


def _cursor(s: Schedule) -> str:
    return f"{s.tenant_id} {s.name}"


def _parse_cursor(cursor: str | None) -> tuple[str, str] | None:
    if cursor is None:
        return None
    tenant, _, name = cursor.partition(" ")
    return tenant, name


CURSOR_PATTERN = r"^[^\x00-\x20\x7f]{1,128} [a-z0-9._-]{1,64}$"  # "<tenant> <name>"


@router.post("/schedules", status_code=201, response_model=ScheduleOut,
             dependencies=[JsonBody],
             responses={403: {"model": ErrorBody,
                              "description": "`tenant_id` names another tenant than the "
                                             "token's, or an admin token leaves it out."},
                        409: {"model": ErrorBody,
                              "description": "The tenant has a schedule of this name."},
                        415: {"model": ErrorBody,
                              "description": "No `Content-Type: application/json`."}})
async def create_schedule(body: ScheduleIn, who: Who, store: Store,
                          response: Response) -> ScheduleOut:
    """Create a schedule (at most 100 per tenant). Its first tick is the
    first after now."""
    cron = Cron.checked(body.cron, body.timezone)
    try:
        schedule = await store.create_schedule(
            tenant_for(body.tenant_id, who), body.name, cron,
            body.template.model_dump(exclude_none=True), overlap=body.overlap,
            paused=body.paused)
    except ScheduleExists as exc:
        raise ErrorAnswer(409, "schedule_exists", str(exc), "name") from None
    response.headers["Location"] = f"/v1/schedules/{schedule.id}"
    return ScheduleOut.of(schedule)


@router.get("/schedules", response_model=SchedulePage)
async def list_schedules(
    who: Who, store: Store, limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200, pattern=CURSOR_PATTERN)] = None,
) -> SchedulePage:
    """The tenant's schedules by name (admin: every tenant's); pass
    `next_cursor` back as `cursor` for the next page."""
    items = await store.list_schedules(tenant_id=who.scope, limit=limit,
                                       after=_parse_cursor(cursor))
    return SchedulePage(items=[ScheduleOut.of(s) for s in items],
                        next_cursor=_cursor(items[-1]) if len(items) == limit else None)


async def _one(action: Any) -> ScheduleOut:
    try:
        return ScheduleOut.of(await action)
    except ScheduleNotFound:
        raise ErrorAnswer(404, "not_found", "schedule not found") from None


@router.get("/schedules/{schedule_id}", response_model=ScheduleOut, responses=NOT_FOUND)
async def get_schedule(schedule_id: UUID, who: Who, store: Store) -> ScheduleOut:
    return await _one(store.get_schedule(schedule_id, tenant_id=who.scope))


@router.post("/schedules/{schedule_id}/pause", response_model=ScheduleOut,
             responses=NOT_FOUND)
async def pause_schedule(schedule_id: UUID, who: Who, store: Store) -> ScheduleOut:
    """No tick is enqueued while paused."""
    return await _one(store.set_schedule_paused(schedule_id, True, tenant_id=who.scope))


@router.post("/schedules/{schedule_id}/resume", response_model=ScheduleOut,
             responses=NOT_FOUND)
async def resume_schedule(schedule_id: UUID, who: Who, store: Store) -> ScheduleOut:
    """Ticks again from the first after now: the paused time is not caught up."""
    return await _one(store.set_schedule_paused(schedule_id, False, tenant_id=who.scope))


@router.delete("/schedules/{schedule_id}", status_code=204, response_class=Response,
               responses=NOT_FOUND)
async def delete_schedule(schedule_id: UUID, who: Who, store: Store) -> Response:
    """Delete the schedule; the runs it enqueued stay."""
    try:
        await store.delete_schedule(schedule_id, tenant_id=who.scope)
    except ScheduleNotFound:
        raise ErrorAnswer(404, "not_found", "schedule not found") from None
    return Response(status_code=204)
