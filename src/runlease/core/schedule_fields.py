"""A schedule's fields, defined once: the server's Schedule (db/schedules.py)
and the clients' ScheduleView (client/schedules.py) are this plus how each
reads itself (a database row, the API's JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID


@dataclass(frozen=True, slots=True)
class ScheduleFields:
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
