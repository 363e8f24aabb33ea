"""A run's events and durable steps (statements in sql/run_events.sql and
sql/run_steps.sql): written fenced by the worker, read by the API."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from runlease.core import bounds
from runlease.core.states import TERMINAL, RunStatus
from runlease.db.channels import EVENTS_CHANNEL
from runlease.db.executor import Conn, Executor
from runlease.db.models import Event, Lease, Run, Step
from runlease.errors import ValidationError

MAX_STEPS_PAGE = 500
MAX_FANOUT_RUNS = 1000  # runs in one fan-out read
MAX_FANOUT_ROWS = 5000  # about the most event rows one fan-out read returns


@dataclass(slots=True)
class RunNews:
    """What one fan-out read found for one run: its new events (at most the
    read's per-run limit) and its status in the same snapshot."""

    status: RunStatus
    events: list[Event] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


class EventStore(Executor):
    """Events and steps: fenced appends, and reads by run."""

    async def record_events(
        self,
        lease: Lease,
        events: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        conn: Conn | None = None,
    ) -> int:
        """Append events (redacted, bounded), fenced; returns the last seq."""
        if not events:
            raise ValidationError("events", "must not be empty")
        kinds: list[str] = []
        datas: list[str] = []
        for kind, data in events:
            if bounds.check_event_kind(kind).startswith("run."):
                # Reserved: the console reads how each attempt ended from them.
                raise ValidationError("kind", "run.* kinds are the run's lifecycle events, "
                                              "written by runlease itself")
            kinds.append(kind)
            if not isinstance(data, Mapping):
                raise ValidationError("data", "must be a JSON object")
            datas.append(bounds.json_text("data", dict(data), bounds.MAX_EVENT_BYTES,
                                          self.redactor.json))
        rows = await self._fenced("run_event_record", lease, {
            "kinds": kinds, "datas": datas, "channel": EVENTS_CHANNEL,
        }, conn)
        return int(rows[0]["event_seq"])

    async def tool_output_used(self, run_id: UUID, *,
                               conn: Conn | None = None) -> tuple[int, int]:
        """(events, bytes of text) the run's tools have stored, all attempts."""
        rows = await self._rows("run_tool_output_used", {"id": run_id}, conn)
        return int(rows[0]["events"]), int(rows[0]["bytes"])

    async def record_event(
        self, lease: Lease, kind: str, data: Mapping[str, Any], *, conn: Conn | None = None
    ) -> int:
        return await self.record_events(lease, [(kind, data)], conn=conn)

    async def record_step(
        self, lease: Lease, key: str, result: Any, *, conn: Conn | None = None
    ) -> Any:
        """Commit a durable step result (redacted, like events: it is what a
        tool printed), fenced; returns the result as stored. If the key was
        already recorded, the earlier result stays and is returned."""
        bounds.check_step_key(key)
        text = bounds.result_text("result", result, bounds.MAX_STEP_RESULT_BYTES,
                                  self.redactor.json)
        rows = await self._fenced("run_step_record", lease, {"key": key, "result": text}, conn)
        return rows[0]["result"]

    async def get_steps(self, run_id: UUID, *, conn: Conn | None = None) -> dict[str, Step]:
        rows = await self._rows("run_steps_get", {"id": run_id}, conn)
        return {r["step_key"]: Step.from_row(r) for r in rows}

    async def steps_page(
        self, run_id: UUID, *, after: str | None = None, limit: int = 20,
        max_bytes: int = 4 * bounds.MAX_STEP_RESULT_BYTES, conn: Conn | None = None,
    ) -> tuple[list[Step], str | None]:
        """A page of a run's steps in step-key order, at most `limit` and about
        `max_bytes` of results; and the cursor of the next page (None: last)."""
        if not 1 <= limit <= MAX_STEPS_PAGE:
            raise ValidationError("limit", f"must be between 1 and {MAX_STEPS_PAGE}")
        if after is not None:
            bounds.check_step_key(after)
        rows = await self._rows("run_steps_page", {"id": run_id, "after": after, "limit": limit,
                                                   "max_bytes": max_bytes}, conn)
        steps = [Step.from_row({**r, "run_id": run_id}) for r in rows if r["fits"]]
        more = len(rows) == limit or len(steps) < len(rows)
        return steps, (steps[-1].step_key if more and steps else None)

    async def events_after(
        self, run_id: UUID, after: int = 0, *, limit: int = 1000, conn: Conn | None = None
    ) -> list[Event]:
        rows = await self._rows(
            "run_events_after", {"id": run_id, "after": after, "limit": limit}, conn
        )
        return [Event.from_row(r) for r in rows]

    async def events_fanout(
        self, after: Mapping[UUID, int], *, conn: Conn | None = None
    ) -> tuple[dict[UUID, RunNews], int]:
        """New events of many runs in one statement, each run after its own
        seq; returns what each run has (a run missing from it is gone), and
        the per-run limit used: a run that got that many has more."""
        if not 1 <= len(after) <= MAX_FANOUT_RUNS:
            raise ValidationError("runs", f"must be between 1 and {MAX_FANOUT_RUNS}")
        # Bounded as a whole: a thousand runs with a backlog each must not
        # come back as one huge result; a run cut short is read again.
        limit = max(10, min(500, MAX_FANOUT_ROWS // len(after)))
        rows = await self._tuples("run_events_fanout", {
            "ids": list(after), "afters": list(after.values()), "limit": limit}, conn)
        news: dict[UUID, RunNews] = {}
        for run_id, status, seq, kind, data, created_at in rows:
            item = news.get(run_id)
            if item is None:
                item = news[run_id] = RunNews(RunStatus(status))
            if seq is not None:
                item.events.append(Event(run_id, seq, kind, data, created_at))
        return news, limit

    async def runs_ended(self, ids: Sequence[UUID], *, conn: Conn | None = None
                         ) -> dict[UUID, Run]:
        """The rows of runs the fan-out saw finish, in one statement."""
        rows = await self._rows("run_events_ended", {"ids": list(ids)}, conn)
        return {r["id"]: Run.from_row(r) for r in rows}
