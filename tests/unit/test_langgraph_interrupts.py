"""What a LangGraph interrupt asks a person (runlease.integrations.langgraph):
its value as wait_for_input's prompt, schema and timeout."""

from __future__ import annotations

from langgraph.types import Interrupt

from runlease.integrations.langgraph import interrupt_request


def test_a_string_is_the_prompt() -> None:
    assert interrupt_request(Interrupt("Deploy?", id="a")) == ("Deploy?", None, None)


def test_a_dict_gives_prompt_schema_and_timeout() -> None:
    asked = Interrupt({"prompt": "Deploy?", "schema": {"type": "boolean"}, "timeout_s": 60},
                      id="a")
    assert interrupt_request(asked) == ("Deploy?", {"type": "boolean"}, 60.0)


def test_a_hostile_timeout_is_ignored_and_a_long_prompt_cut() -> None:
    prompt, schema, timeout_s = interrupt_request(
        Interrupt({"prompt": "x" * 100_000, "timeout_s": True}, id="a"))
    assert (len(prompt or ""), schema, timeout_s) == (8192, None, None)


def test_another_value_is_shown_as_json() -> None:
    assert interrupt_request(Interrupt({"tool": "rm", "args": [1]}, id="a")) == (
        '{"tool": "rm", "args": [1]}', None, None)
    assert interrupt_request(Interrupt(None, id="a")) == ("null", None, None)
