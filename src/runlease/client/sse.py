"""A run's event stream: Server-Sent Events parsed, and the policy that
resumes a dropped stream where it stopped (Last-Event-ID)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from runlease.client.errors import RETRY_STATUSES, ApiError


@dataclass(frozen=True, slots=True)
class StreamEvent:
    seq: int
    kind: str
    data: dict[str, Any]
    created_at: str


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The last item of an event stream: the run is finished."""

    status: str
    error_code: str | None
    attempts: int


class SseParser:
    """Server-Sent Events, line by line (the parts this API sends)."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> StreamEvent | RunEnded | None:
        if line == "":
            if not self._data:
                return None
            data, kind = "\n".join(self._data), self._event
            self._event, self._data = "message", []
            payload = json.loads(data)
            if kind == "end":
                return RunEnded(payload["status"], payload.get("error_code"),
                                payload.get("attempts", 0))
            return StreamEvent(payload["seq"], payload["kind"], payload.get("data", {}),
                               payload.get("created_at", ""))
        if line.startswith(":"):
            return None  # a keepalive comment
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None  # `id` needs no keeping: the event's seq is in its data



class Resume:
    """Where a dropped event stream resumes (Last-Event-ID), and when: the
    reconnect policy both clients share."""

    def __init__(self, run_id: UUID | str, after: int, max_reconnects: int | None) -> None:
        self.run_id = run_id
        self.after = after
        self.max_reconnects = max_reconnects
        self.reconnects = 0
        self.delay = 0.2
        self.ended = False
        self.answered = False  # has the API answered once (any status)?
        self._parser = SseParser()

    def take(self, line: str) -> tuple[StreamEvent | RunEnded, ...]:
        """One line of the stream: the item it completes (none or one), noted
        as handed out; `ended` once that is the RunEnded."""
        item = self._parser.feed(line)
        if item is None:
            return ()
        if isinstance(item, StreamEvent):
            self.after = item.seq
            self.delay = 0.2
        self.ended = isinstance(item, RunEnded)
        return (item,)

    def dropped(self, error: Exception | None) -> float:
        """The stream ended early (error None: the server closed it). Returns
        the wait before the next try; raises an answer that a retry will not
        change, or when max_reconnects is spent."""
        if isinstance(error, ApiError) and error.status not in RETRY_STATUSES:
            raise error
        if error is not None and not isinstance(error, ApiError) and not self.answered:
            # Never reached: a wrong URL or an API that is not running. Say
            # so now rather than retry in silence forever; a stream that
            # was served once is resumed (the API restarting, a proxy's cut).
            raise error
        self._parser = SseParser()  # the next connection starts a new event
        self.reconnects += 1
        if self.max_reconnects is not None and self.reconnects > self.max_reconnects:
            raise ConnectionError(
                f"event stream of {self.run_id} dropped {self.reconnects} times")
        delay, self.delay = self.delay, min(5.0, self.delay * 2)
        return delay
