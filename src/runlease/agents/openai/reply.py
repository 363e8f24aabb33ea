"""A streamed Chat Completions reply put back together: server-sent events
parsed, content and tool-call deltas assembled into one assistant message."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CALL_ID_MAX_CHARS = 200  # the step key `tool-<id>` must stay within 255 characters


class EventParser:
    """Server-sent events, line by line: the data of each event, or None."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        if not line:  # a blank line ends an event
            data, self._data = self._data, []
            return "\n".join(data) if data else None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None  # comments (":..."), event:, id:, retry: carry nothing we use


@dataclass
class Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class Reply:
    """A streamed assistant message put back together from its deltas."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, Call] = {}
        self.finish_reason: str | None = None
        self.done = False
        self.usage: object = None  # the completion's `usage`, if the server sent it

    @property
    def complete(self) -> bool:
        # [DONE] is the protocol's end; a few servers stop after the chunk
        # with finish_reason instead, which is as complete.
        return self.done or self.finish_reason is not None

    def add(self, chunk: Mapping[str, Any]) -> str:
        """Take one chunk (or a whole non-streamed completion); return its new text."""
        text = ""
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # we never ask for n > 1
            delta = choice.get("delta") or choice.get("message") or {}
            if isinstance(delta.get("content"), str):
                text += delta["content"]
            parts = delta.get("tool_calls")
            for position, part in enumerate(parts if isinstance(parts, list) else []):
                if isinstance(part, dict):
                    self._add_call(position, part)
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
        text = text.replace("\x00", "\ufffd")  # jsonb refuses NUL, and deltas are stored
        self.content.append(text)
        return text

    def _add_call(self, position: int, part: Mapping[str, Any]) -> None:
        index = part.get("index")
        call = self.calls.setdefault(index if isinstance(index, int) else position, Call())
        function = part.get("function") or {}
        # id and name are taken once: some servers repeat them on every fragment.
        if not call.id and isinstance(part.get("id"), str):
            call.id = part["id"]
        if not call.name and isinstance(function.get("name"), str):
            call.name = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments.append(arguments)
        elif isinstance(arguments, dict):  # a server that sends parsed arguments
            call.arguments.append(json.dumps(arguments))

    def message(self, used_ids: set[str], turn: int) -> dict[str, Any]:
        content = "".join(self.content)
        calls = []
        for position, index in enumerate(sorted(self.calls)):
            call = self.calls[index]
            call_id = call.id
            # The id names a durable step, so it must be unique within the run;
            # some servers send none, or "call_0" on every turn.
            if (not call_id or call_id in used_ids or len(call_id) > CALL_ID_MAX_CHARS
                    or not call_id.isprintable()):
                call_id = f"call_t{turn}_{position}"
            used_ids.add(call_id)
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": call.name,
                                       "arguments": "".join(call.arguments)}})
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = calls
        else:
            message["content"] = content
        return message


def used_call_ids(messages: Sequence[Mapping[str, Any]]) -> set[str]:
    used: set[str] = set()
    for message in messages:
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                used.add(call["id"])
    return used
