from __future__ import annotations

import pytest

from runlease.core import bounds
from runlease.core.bounds import Budget
from runlease.errors import ValidationError


def test_budget_parses_known_fields() -> None:
    budget = Budget.parse({"max_turns": 5, "deadline_s": 2.5})
    assert budget == Budget(max_turns=5, deadline_s=2.5)
    assert budget.to_json() == {"max_turns": 5, "deadline_s": 2.5}
    assert Budget.parse(None) == Budget()


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"max_turns": 0}, "budget.max_turns"),
        ({"max_tool_calls": -1}, "budget.max_tool_calls"),
        ({"deadline_s": float("inf")}, "budget.deadline_s"),
        ({"deadline_s": True}, "budget.deadline_s"),
        ({"turns": 1}, "budget.turns"),
        ([1], "budget"),
    ],
)
def test_budget_rejects(value: object, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        Budget.parse(value)
    assert err.value.field == field


def test_pool_names_follow_kubernetes_naming() -> None:
    assert bounds.check_pool("gpu-batch-1") == "gpu-batch-1"
    for bad in ("-x", "x-", "a_b", "A", "a" * 49):
        with pytest.raises(ValidationError):
            bounds.check_pool(bad)


def test_json_text_is_compact_and_bounded() -> None:
    assert bounds.json_text("input", {"a": [1, "é"]}, 100) == '{"a":[1,"é"]}'
    with pytest.raises(ValidationError, match="over the bound"):
        bounds.json_text("input", {"a": "é" * 60}, 100)  # 120 bytes in UTF-8


def test_nul_is_refused_but_an_escaped_backslash_u0000_is_text() -> None:
    with pytest.raises(ValidationError, match="NUL"):
        bounds.json_text("input", {"a": "x\x00y"}, 1000)
    # The characters backslash, u, 0, 0, 0, 0 are ordinary text (code, say).
    assert bounds.json_text("input", {"a": r"use \u0000 here"}, 1000)
