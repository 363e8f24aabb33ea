"""Runs as the API shows them, parsed from its JSON."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from runlease.core.run_fields import RunFields
from runlease.core.states import TERMINAL


@dataclass(frozen=True, slots=True, kw_only=True)
class RunView(RunFields):
    """A run as the API shows it."""

    lease: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    created: bool = field(default=True, compare=False)  # False: an Idempotency-Key repeat

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, data: Mapping[str, Any], created: bool = True) -> RunView:
        stamps = ("created_at", "updated_at", "available_at", "cancel_requested_at",
                  "finished_at")
        values: dict[str, Any] = {
            k: (datetime.fromisoformat(v) if k in stamps and v else v)
            for k, v in data.items() if k in cls.__dataclass_fields__}
        values["id"] = UUID(str(data["id"]))
        for link in ("parent_run_id", "rerun_of"):
            if values.get(link):
                values[link] = UUID(str(values[link]))
        values["created"] = created
        return cls(**values)


@dataclass(frozen=True, slots=True)
class RunPage:
    items: list[RunView]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class StepView:
    """A committed durable step of a run, as the API shows it."""

    key: str
    result: Any
    attempt: int
    lease_epoch: int
    created_at: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepView:
        return cls(key=data["key"], result=data.get("result"), attempt=data["attempt"],
                   lease_epoch=data["lease_epoch"],
                   created_at=datetime.fromisoformat(data["created_at"]))


@dataclass(frozen=True, slots=True)
class StepPage:
    items: list[StepView]
    next_cursor: str | None
