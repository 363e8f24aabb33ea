"""Schedules, for both clients (mixed into Client and AsyncClient)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import httpx

from runlease.client.calls import Call, check, sends
from runlease.core.schedule_fields import ScheduleFields


@dataclass(frozen=True, slots=True)
class ScheduleView(ScheduleFields):
    """A schedule as the API shows it."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScheduleView:
        stamps = ("next_tick_at", "created_at", "updated_at", "last_tick_at")
        values: dict[str, Any] = {k: (datetime.fromisoformat(v) if k in stamps and v else v)
                                  for k, v in data.items() if k in cls.__dataclass_fields__}
        values["id"] = UUID(str(data["id"]))
        if data.get("last_run_id"):
            values["last_run_id"] = UUID(str(data["last_run_id"]))
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SchedulePage:
    items: list[ScheduleView]
    next_cursor: str | None


def schedule_body(name: str, cron: str, template: Mapping[str, Any], timezone: str,
                  overlap: str, paused: bool, tenant_id: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "cron": cron, "template": dict(template),
                            "timezone": timezone, "overlap": overlap, "paused": paused}
    if tenant_id is not None:
        body["tenant_id"] = tenant_id
    return body


def page(data: Mapping[str, Any]) -> SchedulePage:
    return SchedulePage([ScheduleView.from_json(i) for i in data["items"]],
                        data.get("next_cursor"))


def page_params(limit: int, cursor: str | None) -> dict[str, Any]:
    return {"limit": limit, **({"cursor": cursor} if cursor else {})}


def _schedule(response: httpx.Response) -> ScheduleView:
    return ScheduleView.from_json(check(response))


def _page(response: httpx.Response) -> SchedulePage:
    return page(check(response))


def _nothing(response: httpx.Response) -> None:
    check(response)


def _on_one(name: str, method: str, action: str,
            doc: str) -> Callable[[UUID | str], Call[ScheduleView]]:
    """The call of a client method on one schedule named by its id (read,
    pause, resume), answered by the schedule: `name` and `doc` are the method's."""
    def call(schedule_id: UUID | str) -> Call[ScheduleView]:
        return Call(method, f"/v1/schedules/{schedule_id}{action}", _schedule)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = doc
    return call


class Schedules:
    """Each method declares its call once; `sends` makes it both clients'."""

    @sends
    def create_schedule(name: str, cron: str, template: Mapping[str, Any], *,
                        timezone: str = "UTC", overlap: str = "skip", paused: bool = False,
                        tenant_id: str | None = None) -> Call[ScheduleView]:
        """A schedule enqueuing `template` (a submit's fields: input, pool,
        priority, ...) at each tick of `cron` read in `timezone`."""
        return Call("POST", "/v1/schedules", _schedule, json=schedule_body(
            name, cron, template, timezone, overlap, paused, tenant_id))

    @sends
    def schedules(*, limit: int = 50, cursor: str | None = None) -> Call[SchedulePage]:
        return Call("GET", "/v1/schedules", _page, params=page_params(limit, cursor))

    schedule = sends(_on_one("schedule", "GET", "", "One schedule."))
    pause_schedule = sends(_on_one("pause_schedule", "POST", "/pause",
                                   "Enqueue nothing until resumed."))
    resume_schedule = sends(_on_one("resume_schedule", "POST", "/resume",
                                    "Tick again, from the first tick after now."))

    @sends
    def delete_schedule(schedule_id: UUID | str) -> Call[None]:
        return Call("DELETE", f"/v1/schedules/{schedule_id}", _nothing)
