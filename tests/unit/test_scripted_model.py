"""The scripted model of `runlease dev --agent`: what it answers, from the
conversation alone (runlease/scripted_model.py)."""

from __future__ import annotations

import json
from typing import Any

from runlease.scripted_model import next_turn

TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"seats": {"type": "integer"},
                                         "window": {"type": "boolean"}}}}},
]


def call(call_id: str, name: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}]}


def test_each_offered_tool_is_called_once_then_it_answers_with_their_results() -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be nice."},
                                      {"role": "user", "content": "Oslo please"}]
    text, first = next_turn({"messages": messages, "tools": TOOLS})
    assert text == ""
    assert first is not None
    assert (first["name"], json.loads(first["arguments"])) == ("weather", {"city": "Oslo please"})
    messages += [call(first["id"], "weather"),
                 {"role": "tool", "tool_call_id": first["id"], "content": "sunny"}]
    _, second = next_turn({"messages": messages, "tools": TOOLS})
    assert second is not None
    assert (second["name"], json.loads(second["arguments"])) == (
        "book", {"seats": 1, "window": True})
    assert second["id"] != first["id"]
    messages += [call(second["id"], "book"),
                 {"role": "tool", "tool_call_id": second["id"], "content": "booked"}]
    text, none = next_turn({"messages": messages, "tools": TOOLS})
    assert none is None
    assert "You asked: Oslo please" in text
    assert "weather returned: sunny" in text
    assert "book returned: booked" in text


def test_a_new_user_message_starts_over_and_odd_input_is_answered() -> None:
    messages = [{"role": "user", "content": "hi"}, call("c1", "weather"),
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
                {"role": "user", "content": [{"type": "text", "text": "again"}]}]
    _, again = next_turn({"messages": messages, "tools": TOOLS[:1]})
    assert again is not None
    assert json.loads(again["arguments"]) == {"city": "again"}
    text, none = next_turn({"messages": "not a list", "tools": "nor this"})
    assert none is None
    assert text.startswith("(scripted model)")
