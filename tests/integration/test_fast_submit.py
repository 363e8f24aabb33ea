"""POST /v1/runs answered by api/fast_submit.py: the same answer as the
route's, counted in the same metric, and every request it is not sure of
left to the route (which answers it exactly as before)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from runlease import metrics
from tests.support.api import Api

MOVING = {"id", "created_at", "updated_at", "available_at", "parent_run_id", "input",
          "idempotency_key"}


def fast(api: Api) -> int:
    return api.server.app_state.fast_submits


def requests(path: str, status: str) -> float:
    return metrics.API_REQUESTS.labels("POST", path, status)._value.get()


async def test_the_fast_answer_is_the_routes(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        before, counted = fast(api), requests("/v1/runs", "201")
        body = {"input": {"q": "x"}, "labels": {"team": "a"}, "priority": 3,
                "budget": {"max_turns": 5}, "backoff_base_s": 2}
        quick = await acme.post("/v1/runs", json=body, headers={"Idempotency-Key": "k1"})
        assert quick.status_code == 201, quick.text
        assert fast(api) == before + 1
        assert requests("/v1/runs", "201") == counted + 1
        assert quick.headers["Location"] == f"/v1/runs/{quick.json()['id']}"
        assert quick.json() == (await acme.get(quick.headers["Location"])).json()
        # With a parent the route answers; the same fields, the same values.
        routed = await acme.post("/v1/runs", json=body | {
            "parent_run_id": quick.json()["id"], "input": {"q": "y"}})
        assert routed.status_code == 201, routed.text
        assert fast(api) == before + 1
        assert list(routed.json()) == list(quick.json())
        assert {k: v for k, v in routed.json().items() if k not in MOVING} == {
            k: v for k, v in quick.json().items() if k not in MOVING}
        # The key again, and the key with another input: answered here too.
        again = await acme.post("/v1/runs", json=body, headers={"Idempotency-Key": "k1"})
        assert (again.status_code, again.json()) == (200, quick.json())
        other = await acme.post("/v1/runs", json=body | {"input": {}},
                                headers={"Idempotency-Key": "k1"})
        assert other.status_code == 409
        assert other.json()["error"] == {
            "code": "idempotency_conflict", "field": "Idempotency-Key",
            "message": other.json()["error"]["message"]}
        assert fast(api) == before + 3


@pytest.mark.parametrize(("who", "headers", "content", "status", "code"), [
    (None, {}, b'{"input": {}}', 401, "unauthorized"),
    ("acme", {"Authorization": "Bearer nope"}, b'{"input": {}}', 401, "unauthorized"),
    ("acme", {"Content-Type": "text/plain"}, b'{"input": {}}', 415, "unsupported_media_type"),
    ("acme", {}, b'{"input": {}, "priority": 1000}', 422, "invalid_request"),
    ("acme", {}, b'{"input": {}, "surprise": 1}', 422, "invalid_request"),
    ("acme", {}, b'{"input": {', 422, "invalid_request"),
    ("acme", {}, b'[]', 422, "invalid_request"),
    ("acme", {}, b'{"input": {}, "tenant_id": "globex"}', 403, "forbidden"),
    ("admin", {}, b'{"input": {}}', 403, "tenant_required"),
    ("acme", {"Idempotency-Key": "k" * 256}, b'{"input": {}}', 422, "invalid_request"),
    ("acme", {}, b'{"input": {"x": NaN}}', 422, "invalid_request"),
    ("acme", {}, b'{"input": {}, "backoff_base_s": 10, "backoff_cap_s": 99999999}', 422,
     "invalid_request"),
])
async def test_what_it_is_not_sure_of_the_route_answers(
        api: Api, who: str | None, headers: dict[str, str], content: bytes, status: int,
        code: str) -> None:
    before = fast(api)
    sent: dict[str, Any] = {"Content-Type": "application/json", **api.headers(who), **headers}
    async with httpx.AsyncClient(base_url=api.url) as http:
        answer = await http.post("/v1/runs", content=content, headers=sent)
    assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), answer.text
    # Left to the route, except a body the route also accepts and the store refuses.
    assert fast(api) - before == (1 if b"NaN" in content else 0)


async def test_a_repeated_header_is_left_to_the_route(api: Api) -> None:
    before = fast(api)
    headers = [("Authorization", f"Bearer {api.token('acme')}"),
               ("Authorization", f"Bearer {api.token('globex')}"),
               ("Content-Type", "application/json")]
    async with httpx.AsyncClient(base_url=api.url) as http:
        answer = await http.post("/v1/runs", content=b'{"input": {}}', headers=headers)
    assert answer.status_code == 201  # the route reads the first one, as before
    assert answer.json()["tenant_id"] == "acme"
    assert fast(api) == before
