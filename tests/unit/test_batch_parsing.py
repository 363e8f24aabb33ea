"""What a bulk submit's fast path relies on: pydantic-core's JSON mode reads
a batch body as FastAPI's json.loads + Python mode does (or refuses it, and
the route answers), bounds.check_parsed_object checks an input as
check_object does, and ids minted as text are UUIDv7s in order."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import pytest

from runlease.api.batch import RunBatchIn
from runlease.core import bounds
from runlease.core.ids import uuid7_texts
from runlease.errors import ValidationError

BODIES = [
    b'{"runs":[{"input":{},"delay_s":5}]}',
    b'{"runs":[{"input":{},"delay_s":5.5,"priority":3.0}]}',
    b'{"runs":[{"input":{},"priority":true}]}',
    b'{"runs":[{"input":{},"priority":"3"}]}',
    b'{"runs":[{"input":{"a":1,"a":2}}]}',
    b'{"runs":[{"input":{"a":NaN}}]}',
    b'{"runs":[{"input":{"a":1e400}}]}',
    b'{"runs":[{"input":{"a":123456789012345678901234567890,"b":-0.0,"c":1.5e-5}}]}',
    b'{"runs":[{"input":{},"run_at":"2030-01-01T00:00:00Z"}]}',
    b'{"runs":[{"input":{},"run_at":1700000000}]}',
    b'{"runs":[{"input":{},"run_at":"2030-01-01T00:00:00"}]}',
    b'{"runs":[{"input":{},"run_at":"2030-01-01T00:00:00Z","delay_s":1}]}',
    b'{"runs":[{"input":{},"budget":{"deadline_s":5,"max_cost":1.5,"max_tokens":10.0}}]}',
    b'{"runs":[{"input":{},"budget":{"max_turns":0}}]}',
    b'{"runs":[{"input":{},"labels":{"a":"b"},"idempotency_key":"k"}]}',
    b'{"runs":[{"input":{},"labels":{"bad key":"b"}}]}',
    b'{"runs":[{"input":{},"non_retryable_codes":["x"],"backoff_base_s":2.0}]}',
    b'{"runs":[{"input":{},"max_attempts":1e0,"tenant_id":"\\u00e9"}]}',
    b'{"runs":[{"input":{"x":1.0}}], "runs":[{"input":{}}]}',
    b'{"runs":[{"input":{"s":"\\u0000 \\u2028 \\ud83e\\udd9c"}}]}',
    b'{"runs":[{"input":[]}]}',
    b'{"runs":[{"input":{},"extra":1}]}',
    b'{"runs":[]}',
    b'{"runs":[{"input":{}}],}',
    b'{"runs":[{"input":{}}]} x',
    b'\xef\xbb\xbf{"runs":[{"input":{}}]}',
    b'{"runs":[{"input":{},"parent_run_id":"0190c1a2-0000-7000-8000-000000000000",'
    b'"webhook_url":"https://hooks.example.com/x"}]}',
]


def python_mode(raw: bytes) -> Any:
    try:
        return RunBatchIn.model_validate(json.loads(raw)).model_dump()
    except Exception as exc:  # the kind is what is compared
        return type(exc).__name__


@pytest.mark.parametrize("raw", BODIES)
def test_json_mode_reads_a_body_as_the_route_does(raw: bytes) -> None:
    try:
        fast = RunBatchIn.model_validate_json(raw).model_dump()
    except ValueError:
        return  # refused: the route answers it, as before
    assert repr(fast) == repr(python_mode(raw))  # repr: NaN is read as NaN both ways


def test_a_lone_surrogate_is_left_to_the_route() -> None:
    raw = b'{"runs":[{"input":{"s":"\\ud800"}}]}'
    with pytest.raises(ValueError, match="Invalid JSON"):
        RunBatchIn.model_validate_json(raw)
    assert isinstance(python_mode(raw), dict)  # the store refuses it (test_batch_answers.py)


@pytest.mark.parametrize("value", [
    {}, {"a": [1, 2.5, None, True, {"b": "é \u2028 \x1f \x7f \"q\" \\"}]},
    {"big": 10**40, "f": 1.5e-05, "g": 1e300, "z": -0.0}, {"s": "x" * 400},
])
def test_a_parsed_object_is_written_as_check_object_writes_it(value: dict[str, Any]) -> None:
    text = bounds.check_parsed_object("input", value, 1000)
    assert json.loads(text) == json.loads(bounds.check_object("input", value, 1000)) == value


@pytest.mark.parametrize(("value", "max_bytes", "message"), [
    ({"a": float("nan")}, 1000, "representable"),
    ({"a": float("inf")}, 1000, "representable"),
    ({"a": "\x00"}, 1000, "NUL"),
    ({"a": "\ud800"}, 1000, "Unicode"),
    ({"a": "x" * 200}, 100, "over the bound"),
    ([1], 1000, "JSON object"),
])
def test_a_parsed_object_is_refused_as_check_object_refuses_it(
        value: Any, max_bytes: int, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as fast:
        bounds.check_parsed_object("input", value, max_bytes)
    with pytest.raises(ValidationError) as plain:
        bounds.check_object("input", value, max_bytes)
    assert (type(fast.value), fast.value.field, fast.value.message) == (
        type(plain.value), plain.value.field, plain.value.message)


def test_a_text_at_the_bound_is_checked_as_check_object_checks_it() -> None:
    # Over half the bound, json.dumps's text decides (floats may be written
    # a little longer by it).
    value = {"f": [1e-05] * 30}
    size = len(json.dumps(value, separators=(",", ":")))
    assert bounds.check_parsed_object("input", value, size) == bounds.check_object(
        "input", value, size)
    with pytest.raises(ValidationError, match="over the bound"):
        bounds.check_parsed_object("input", value, size - 1)


def test_ids_minted_as_text_are_uuid7s_in_order() -> None:
    texts = uuid7_texts(5000) + uuid7_texts(3)
    ids = [UUID(t) for t in texts]
    assert [str(u) for u in ids] == texts
    assert {u.version for u in ids} == {7}
    assert {u.variant for u in ids} == {"specified in RFC 4122"}
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
