"""Schedules, for both clients (mixed into Client and AsyncClient)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """A schedule as the API shows it."""

    id: UUID
    tenant_id: str
    name: str
    cron: str
    timezone: str
    template: dict[str, Any]
    overlap: str
    paused: bool
    next_tick_at: datetime
    created_at: datetime
    updated_at: datetime
    last_tick_at: datetime | None = None
    last_run_id: UUID | None = None
    last_error: str | None = None

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


class SyncSchedules:
    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        raise NotImplementedError

    def create_schedule(self, name: str, cron: str, template: Mapping[str, Any], *,
                        timezone: str = "UTC", overlap: str = "skip", paused: bool = False,
                        tenant_id: str | None = None) -> ScheduleView:
        """A schedule enqueuing `template` (a submit's fields: input, pool,
        priority, ...) at each tick of `cron` read in `timezone`."""
        return ScheduleView.from_json(self._call("POST", "/v1/schedules", json=schedule_body(
            name, cron, template, timezone, overlap, paused, tenant_id)))

    def schedules(self, *, limit: int = 50, cursor: str | None = None) -> SchedulePage:
        return page(self._call("GET", "/v1/schedules", params=page_params(limit, cursor)))

    def schedule(self, schedule_id: UUID | str) -> ScheduleView:
        return ScheduleView.from_json(self._call("GET", f"/v1/schedules/{schedule_id}"))

    def pause_schedule(self, schedule_id: UUID | str) -> ScheduleView:
        return ScheduleView.from_json(self._call("POST", f"/v1/schedules/{schedule_id}/pause"))

    def resume_schedule(self, schedule_id: UUID | str) -> ScheduleView:
        return ScheduleView.from_json(self._call("POST",
                                                 f"/v1/schedules/{schedule_id}/resume"))

    def delete_schedule(self, schedule_id: UUID | str) -> None:
        self._call("DELETE", f"/v1/schedules/{schedule_id}")


class AsyncSchedules:
    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def create_schedule(self, name: str, cron: str, template: Mapping[str, Any], *,
                              timezone: str = "UTC", overlap: str = "skip",
                              paused: bool = False,
                              tenant_id: str | None = None) -> ScheduleView:
        return ScheduleView.from_json(await self._call(
            "POST", "/v1/schedules", json=schedule_body(name, cron, template, timezone,
                                                        overlap, paused, tenant_id)))

    async def schedules(self, *, limit: int = 50, cursor: str | None = None) -> SchedulePage:
        return page(await self._call("GET", "/v1/schedules",
                                     params=page_params(limit, cursor)))

    async def schedule(self, schedule_id: UUID | str) -> ScheduleView:
        return ScheduleView.from_json(await self._call("GET", f"/v1/schedules/{schedule_id}"))

    async def pause_schedule(self, schedule_id: UUID | str) -> ScheduleView:
        return ScheduleView.from_json(await self._call(
            "POST", f"/v1/schedules/{schedule_id}/pause"))

    async def resume_schedule(self, schedule_id: UUID | str) -> ScheduleView:
        return ScheduleView.from_json(await self._call(
            "POST", f"/v1/schedules/{schedule_id}/resume"))

    async def delete_schedule(self, schedule_id: UUID | str) -> None:
        await self._call("DELETE", f"/v1/schedules/{schedule_id}")
