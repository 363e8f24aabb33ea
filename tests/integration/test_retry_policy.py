"""A run's own retry policy (issue 15): set on submit through the API and
the SDK, obeyed by a real worker's nack; re-prioritising a pending run."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from runlease.client import ApiError, AsyncClient, Client, Conflict, NotFound
from runlease.core.backoff import RetryPolicy, backoff_s
from runlease.db.store import RunStore
from runlease.errors import ValidationError
from tests.support import agents
from tests.support.api import Api
from tests.support.waiting import until
from tests.support.workers import running_worker


async def test_a_non_retryable_code_is_dead_on_the_first_failure(api: Api, db_url: str,
                                                                   live_store: RunStore) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client:
        doomed = await client.submit({}, max_attempts=5,
                                     non_retryable_codes=["model_unavailable", "refused"])
        assert doomed.non_retryable_codes == ["model_unavailable", "refused"]
        # The control: the same failure, retryable, with no backoff to wait for.
        retried = await client.submit({}, max_attempts=5, backoff_base_s=0, backoff_cap_s=0)
        assert (retried.backoff_base_s, retried.backoff_cap_s) == (0, 0)
        async with running_worker(db_url, agents.retry_once):
            dead = await client.wait(doomed.id, timeout_s=30)
            done = await client.wait(retried.id, timeout_s=30)
    assert (dead.status, dead.attempts, dead.error_code) == ("dead", 1, "model_unavailable")
    assert (done.status, done.attempts) == ("done", 2)
    kinds = [e.kind for e in await live_store.events_after(dead.id)]
    assert kinds == ["run.dead"]


async def test_a_custom_backoff_is_what_the_nack_waits(api: Api, db_url: str,
                                                       live_store: RunStore) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client:
        slow = await client.submit({}, backoff_base_s=3600, backoff_cap_s=7200)
        default = await client.submit({})
        async with running_worker(db_url, agents.retry_once):
            async def retrying(run_id: object) -> object:
                run = await client.get(str(run_id))
                return run if run.status == "pending" and run.attempts == 1 else None
            waiting = await until(lambda: retrying(slow.id), what="the custom retry")
            usual = await until(lambda: retrying(default.id), what="the default retry")
    # By the database clock: the nack sets both in one statement.
    assert (waiting.available_at - waiting.updated_at).total_seconds() == backoff_s(1, 3600,
                                                                                     7200)
    assert (usual.available_at - usual.updated_at).total_seconds() == backoff_s(1)


def test_backoff_formula_and_policy_bounds() -> None:
    assert [backoff_s(n, 10, 60) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 60, 60]
    assert backoff_s(1, 0, 0) == 0
    assert RetryPolicy.checked(600).backoff_cap_s == 600  # a long base lifts the default cap
    assert RetryPolicy.checked(10, 5).backoff_cap_s == 5  # every wait is then the cap
    for bad, field in [((-1,), "backoff_base_s"),
                       ((None, None, ["Not A Code"]), "non_retryable_codes[0]"),
                       ((None, None, ["a"] * 33), "non_retryable_codes"),
                       ((None, None, "abc"), "non_retryable_codes"),
                       ((True,), "backoff_base_s")]:
        with pytest.raises(ValidationError) as caught:
            RetryPolicy.checked(*bad)  # type: ignore[arg-type]
        assert caught.value.field == field


async def test_bad_retry_policies_are_422_naming_the_field(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        for body, field in [({"backoff_base_s": -1}, "backoff_base_s"),
                            ({"backoff_cap_s": 10**9}, "backoff_cap_s"),
                            ({"non_retryable_codes": ["UPPER"]}, "non_retryable_codes.0"),
                            ({"non_retryable_codes": ["x"] * 33}, "non_retryable_codes")]:
            response = await http.post("/v1/runs", json={"input": {}} | body)
            assert response.status_code == 422, (body, response.text)
            assert response.json()["error"]["field"] == field, (body, response.text)


async def test_reprioritise_a_pending_run_within_the_band(api: Api) -> None:
    # The sync client, off the loop that serves the API.
    await asyncio.to_thread(_reprioritise_sync, api)


def _reprioritise_sync(api: Api) -> None:
    with Client(api.url, api.token("admin")) as admin:
        admin.upsert_pool("default", tenant_priority={"acme": {"min": -5, "max": 5}})
    with Client(api.url, api.token("acme")) as acme, Client(api.url,
                                                            api.token("globex")) as globex:
        run = acme.submit({}, priority=1)
        moved = acme.reprioritize(run.id, 5)
        assert moved.priority == 5
        with pytest.raises(ApiError) as outside:
            acme.reprioritize(run.id, 6)
        assert (outside.value.status, outside.value.field) == (422, "priority")
        assert "between -5 and 5" in outside.value.message
        with pytest.raises(NotFound):
            globex.reprioritize(run.id, 0)  # another tenant's run is not found
        acme.cancel(run.id)
        with pytest.raises(Conflict) as finished:
            acme.reprioritize(run.id, 0)
        assert "cancelled" in finished.value.message
        assert acme.get(run.id).priority == 5


async def test_reprioritise_is_audited_and_async(api: Api, live_store: RunStore) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme:
        run = await acme.submit({})
        await acme.reprioritize(run.id, -3)
    events = await live_store.events_after(run.id)
    assert [(e.kind, e.data) for e in events] == [
        ("run.reprioritized", {"from": 0, "to": -3, "by": "tenant:acme"})]
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        for body in ({"priority": 101}, {"priority": "1"}, {}, {"priority": 1, "pool": "x"}):
            response = await http.patch(f"/v1/runs/{run.id}", json=body)
            assert response.status_code == 422, (body, response.text)
