"""A streamed Chat Completions reply put back together: the content and
tool-call deltas of the `openai` package's chunks assembled into one
assistant message.

The chunks are typed, but not validated (the SDK builds them leniently), and
compatible servers differ: some send no tool-call id, or "call_0" on every
turn, or repeat the id and name on every fragment, or send parsed arguments.
So every field is looked at before it is used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk

CALL_ID_MAX_CHARS = 200  # the step key `tool-<id>` must stay within 255 characters


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
        self.usage: dict[str, Any] | None = None

    @property
    def complete(self) -> bool:
        """The message has ended: a chunk said why (stop, tool_calls, length...)."""
        return self.finish_reason is not None

    def add(self, chunk: ChatCompletionChunk | ChatCompletion) -> str:
        """Take one chunk (or a whole non-streamed completion); return its new text."""
        text = ""
        choices = getattr(chunk, "choices", None)
        for choice in choices if isinstance(choices, list) else []:
            if getattr(choice, "index", 0) != 0:
                continue  # we never ask for n > 1
            # A chunk's choice has a delta; a whole completion's, a message.
            part = getattr(choice, "delta", None) or getattr(choice, "message", None)
            content = getattr(part, "content", None)
            if isinstance(content, str):
                text += content
            tool_calls = getattr(part, "tool_calls", None)
            for position, call in enumerate(tool_calls if isinstance(tool_calls, list) else []):
                self._add_call(position, call)
            finish_reason = getattr(choice, "finish_reason", None)
            if isinstance(finish_reason, str):
                self.finish_reason = finish_reason
        usage: Any = getattr(chunk, "usage", None)
        if isinstance(usage, dict):
            self.usage = usage
        elif usage is not None and hasattr(usage, "model_dump"):
            self.usage = usage.model_dump(exclude_none=True)
        text = text.replace("\x00", "\ufffd")  # jsonb refuses NUL, and deltas are stored
        self.content.append(text)
        return text

    def _add_call(self, position: int, part: Any) -> None:
        index = getattr(part, "index", None)
        call = self.calls.setdefault(index if isinstance(index, int) else position, Call())
        function = getattr(part, "function", None)
        # id and name are taken once: some servers repeat them on every fragment.
        if not call.id and isinstance(getattr(part, "id", None), str):
            call.id = part.id
        name = getattr(function, "name", None)
        if not call.name and isinstance(name, str):
            call.name = name
        arguments = getattr(function, "arguments", None)
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
