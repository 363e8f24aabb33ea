"""A bulk submit's answer, made from the texts the store sent
(db/enqueue_batch.py) and its body validated from the raw bytes
(api/fast_batch.py): each run as GET /v1/runs/{id} shows it, existing
runs included, and every body the fast path is not sure of answered by the
route as before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg

from runlease import metrics
from runlease.db.models import Pool
from runlease.db.store import RunStore
from tests.support.api import Api

ODD_TEXT = 'é \u2028 "quoted" back\\slash\nline \u001f tab\t 🦜 \x7f'
# Written back by jsonb as sent (in its own key order): answered from the text sent.
PLAIN_INPUT = {"text": ODD_TEXT, "numbers": [0.1, 0.000015, 123456.789, 10**30, -7, 2.0],
               "nested": {"b": [1, {"a": None, "t": True}], "a": "", "": 0}, "z": False}
# Numbers jsonb writes otherwise (1e+300 as 1 and 300 zeros, -0.0 as 0.0):
# such a run is read back.
ODD_INPUT = {"text": ODD_TEXT, "numbers": [1.5e-05, 1e300, -0.0, 2.5e-320]}


def fast(api: Api) -> int:
    return api.server.app_state.fast_batches


async def same_as_get(http: httpx.AsyncClient, answer: dict[str, Any]) -> None:
    for run in answer["runs"]:
        shown = await http.get(f"/v1/runs/{run['id']}")
        assert shown.status_code == 200
        assert list(run) == list(shown.json())
        assert run == shown.json()


async def test_each_new_run_is_answered_as_get_shows_it(api: Api, live_store: RunStore,
                                                        db_url: str) -> None:
    await live_store.upsert_pool(Pool("other", max_attempts=7))
    later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    past = (datetime.now(UTC) - timedelta(days=2)).isoformat()
    items: list[dict[str, Any]] = [
        {"input": PLAIN_INPUT},
        {"input": ODD_INPUT, "labels": {"team": "search", "n": "é"}, "priority": -3,
         "max_attempts": 4, "idempotency_key": "odd-1",
         "budget": {"max_turns": 5, "deadline_s": 2.5, "max_cost": 3, "max_tokens": 10.0},
         "backoff_base_s": 2, "non_retryable_codes": ["bad_input", "bad_input", "quota"]},
        {"input": {"i": 2}, "pool": "other", "backoff_base_s": 90000 // 2 * 2 - 3600},
        {"input": {"i": 3}, "delay_s": 60.5, "backoff_cap_s": 5},
        {"input": {"i": 4}, "run_at": later},
        {"input": {"i": 5}, "run_at": past, "pool": "other", "max_attempts": 2},
    ]
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as admin:
        before = fast(api)
        counted = metrics.API_REQUESTS.labels("POST", "/v1/runs/batch", "201")._value.get()
        r = await acme.post("/v1/runs/batch", json={"runs": items})
        assert r.status_code == 201, r.text
        assert fast(api) == before + 1
        # Counted under the route's path, as the route's answer is.
        assert metrics.API_REQUESTS.labels("POST", "/v1/runs/batch", "201")._value.get() == (
            counted + 1)
        answer = r.json()
        assert answer["created"] == [True] * len(items)
        await same_as_get(acme, answer)
        runs = answer["runs"]
        assert runs[0]["input"] == PLAIN_INPUT
        assert runs[1]["input"]["text"] == ODD_TEXT
        assert runs[1]["input"]["numbers"] == [1.5e-05, 10**300, 0.0, 2.5e-320]
        assert runs[1]["non_retryable_codes"] == ["bad_input", "quota"]
        assert (runs[2]["max_attempts"], runs[5]["max_attempts"]) == (7, 2)
        assert runs[3]["available_at"] > runs[3]["created_at"]
        assert runs[5]["available_at"] == runs[5]["created_at"]  # a past time means now
        # An admin's batch, for two tenants: shown to the admin as GET shows it.
        r = await admin.post("/v1/runs/batch", json={"runs": [
            {"input": {"i": 6}, "tenant_id": "globex"}, {"input": {}, "tenant_id": "acme"}]})
        assert r.status_code == 201, r.text
        await same_as_get(admin, r.json())
    with psycopg.connect(db_url) as conn:
        labels = conn.execute("SELECT count(*) FROM agent_run_labels").fetchone()
    assert labels == (2,)


async def test_existing_runs_are_answered_whole(api: Api, live_store: RunStore) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        first = await acme.post("/v1/runs/batch", json={"runs": [
            {"input": {"k": 1}, "idempotency_key": "a"}]})
        (lease,) = await live_store.claim("default", "w1", 1)  # now leased
        assert str(lease.run_id) == first.json()["runs"][0]["id"]
        r = await acme.post("/v1/runs/batch", json={"runs": [
            {"input": {"k": 2}, "idempotency_key": "b"},
            {"input": {"k": 1}, "idempotency_key": "a"}]})
        assert r.status_code == 201, r.text
        assert r.json()["created"] == [True, False]
        assert r.json()["runs"][1]["status"] == "leased"
        await same_as_get(acme, r.json())
        again = await acme.post("/v1/runs/batch", json={"runs": [
            {"input": {"k": 2}, "idempotency_key": "b"}]})
        assert (again.status_code, again.json()["created"]) == (200, [False])
        await same_as_get(acme, again.json())


async def test_what_the_fast_path_is_not_sure_of_the_route_answers(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        before = fast(api)
        # A lone surrogate: pydantic-core refuses it, the route's json.loads
        # takes it and the store refuses it, as before.
        r = await acme.post("/v1/runs/batch", content=b'{"runs": [{"input": {"s": "\\ud800"}}]}',
                            headers={"Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == "input"
        # Malformed, unauthenticated, not JSON: the route's own answers.
        r = await acme.post("/v1/runs/batch", content=b'{"runs": [',
                            headers={"Content-Type": "application/json"})
        assert r.status_code == 422
        r = await acme.post("/v1/runs/batch", json={"runs": [{"input": {}}]},
                            headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
        r = await acme.post("/v1/runs/batch", content=b'{"runs": [{"input": {}}]}',
                            headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        assert fast(api) == before
        # A tenant the token may not submit for: through the fast path, the
        # route's 403.
        r = await acme.post("/v1/runs/batch", json={"runs": [
            {"input": {}}, {"input": {}, "tenant_id": "globex"}]})
        assert (r.status_code, r.json()["error"]["field"]) == (403, "runs[1].tenant_id")
        assert fast(api) == before + 1
