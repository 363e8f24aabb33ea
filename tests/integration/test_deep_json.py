"""JSON nested past the bound (bounds.MAX_JSON_DEPTH) is refused where it is
written — a tenant's input, a template, an agent's result, step or event —
with a 4xx or the run's own error, never stored: pydantic-core, which reads
jsonb back and writes the API's answers, refuses values nested over about 200
levels, so one stored would fail every later read of its run with a 500."""

from __future__ import annotations

import json
from typing import Any

import httpx
import psycopg
import pytest

from runlease.core.bounds import MAX_JSON_DEPTH, NotJson, ResultRefused, json_text
from runlease.db.store import NewRun, RunStore
from runlease.errors import ValidationError
from tests.support.api import Api


def nested(depth: int) -> dict[str, Any]:
    """An object `depth` levels deep: {"a": {"a": ... {}}}."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def deep_text(depth: int) -> bytes:
    """A JSON object holding arrays `depth` levels deep in all, as text: a
    body too deep for json.loads itself past about 1,000 levels."""
    return b'{"a":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def count_runs(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        return int(conn.execute("SELECT count(*) FROM agent_runs").fetchone()[0])  # type: ignore[index]


def test_the_bound_counts_levels_not_brackets_in_strings() -> None:
    assert json.loads(json_text("x", nested(MAX_JSON_DEPTH), 10**6)) == nested(MAX_JSON_DEPTH)
    with pytest.raises(NotJson, match=f"over {MAX_JSON_DEPTH} levels"):
        json_text("x", nested(MAX_JSON_DEPTH + 1), 10**6)
    # Arrays count as objects do; tuples (json.dumps writes them as arrays) too.
    with pytest.raises(NotJson):
        json_text("x", {"a": json.loads(deep_text(MAX_JSON_DEPTH + 1))["a"]}, 10**6)
    deep_tuple: Any = ()
    for _ in range(MAX_JSON_DEPTH + 1):
        deep_tuple = (deep_tuple,)
    with pytest.raises(NotJson):
        json_text("x", deep_tuple, 10**6)
    # Brackets inside strings are text, however many.
    text = json_text("x", {"s": "{[" * 5_000, "l": [[1]] * 300}, 10**6)
    assert json.loads(text)["s"] == "{[" * 5_000
    # Far past Python's recursion limit: refused, not a RecursionError.
    very: Any = []
    for _ in range(50_000):
        very = [very]
    with pytest.raises(NotJson):
        json_text("x", very, 10**7)


async def test_the_api_refuses_input_nested_past_the_bound_and_writes_nothing(
        api: Api, db_url: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        for depth in (MAX_JSON_DEPTH + 1, 250, 5_000):
            body = b'{"input": ' + json.dumps(nested(depth)).encode() \
                if depth < 900 else b'{"input": ' + deep_text(depth)
            answer = await http.post("/v1/runs", content=body + b"}",
                                     headers={"Content-Type": "application/json"})
            assert 400 <= answer.status_code < 500, (depth, answer.status_code, answer.text)
            if depth < 900:  # deeper bodies are refused by the JSON parser itself
                assert answer.json()["error"]["field"] == "input", answer.text
        batch = {"runs": [{"input": {"ok": True}}, {"input": nested(MAX_JSON_DEPTH + 1)}]}
        answer = await http.post("/v1/runs/batch", json=batch)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["code"] == "batch_refused"
        assert [(e["index"], e["field"]) for e in answer.json()["errors"]] == [(1, "input")]
        template = {"name": "deep", "cron": "*/5 * * * *",
                    "template": {"input": nested(MAX_JSON_DEPTH + 1)}}
        answer = await http.post("/v1/schedules", json=template)
        assert answer.status_code == 422, answer.text
        assert count_runs(db_url) == 0

        # At the bound: stored, and read back whole by GET and by the list.
        ok = await http.post("/v1/runs", json={"input": nested(MAX_JSON_DEPTH)})
        assert ok.status_code == 201, ok.text
        got = await http.get(f"/v1/runs/{ok.json()['id']}")
        assert got.status_code == 200
        assert got.json()["input"] == nested(MAX_JSON_DEPTH)
        listed = await http.get("/v1/runs")
        assert listed.status_code == 200
        assert listed.json()["items"][0]["input"] == \
            nested(MAX_JSON_DEPTH)


async def test_an_agents_deep_result_step_or_event_is_refused_not_stored(
        store: RunStore) -> None:
    await store.enqueue_many("default", [NewRun("acme", {"i": i}) for i in range(2)])
    leases = await store.claim("default", "w", 2)
    with pytest.raises(ValidationError) as refused:
        await store.record_event(leases[0], "tool.output", {"x": nested(MAX_JSON_DEPTH + 1)})
    assert refused.value.field == "data"
    with pytest.raises(ResultRefused) as step:
        await store.record_step(leases[0], "k", nested(MAX_JSON_DEPTH + 5))
    assert step.value.code == "result_not_json"
    # One deep result among good ones: that run ends with result_not_json,
    # the other is acked.
    lost = await store.ack_many([(leases[0], nested(3_000)), (leases[1], {"ok": 1})])
    assert lost == set()
    runs = [await store.get(lease.run_id) for lease in leases]
    assert [(r.status, r.error_code) for r in runs] == [("dead", "result_not_json"),
                                                         ("done", None)]
    assert runs[1].result_json == {"ok": 1}
