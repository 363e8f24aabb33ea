"""Limits that hold on every path (issue 32): a tenant's submit rate and
its quota of waiting runs count what its schedules and its runs' children
enqueue, as they count the API's submits and batches; a submit past the
quota is a 429 queue_full, on the single, fast and batch paths alike."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

from runlease.clock import ManualClock
from runlease.core.cron import Cron
from runlease.db.rates import Throttled
from runlease.db.store import RunStore
from tests.support.api import Api
from tests.support.waiting import until
from tests.support.workers import running_worker

START = datetime(2026, 12, 1, 10, 2, 0, tzinfo=UTC)
EVERY_5 = Cron.checked("*/5 * * * *")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


def count(db_url: str, tenant: str, status: str | None = None) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM agent_runs WHERE tenant_id = %s"
                           " AND (%s::text IS NULL OR status = %s)",
                           (tenant, status, status)).fetchone()
    assert row is not None
    return int(row[0])


async def put_pool(api: Api, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        return await http.put("/v1/pools/default", json=body)


async def test_schedules_ticks_count_in_the_tenants_submit_rate(
    store: RunStore, clock: ManualClock
) -> None:
    """The review's case: 20 schedules of one tenant at a rate of 1 a
    minute enqueued 20 runs in a minute."""
    await store.set_tenant_rates("default", "acme", 2, None)
    for i in range(5):
        await store.create_schedule("acme", f"s{i}", EVERY_5, {"input": {"i": i}})
    await store.create_schedule("globex", "g", EVERY_5, {"input": {}})
    clock.advance(3 * 60)
    ticks = await store.fire_due_schedules()
    mine = [t for t in ticks if t.tenant_id == "acme"]
    assert len(mine) == 5
    assert sum(t.run_id is not None for t in mine) == 2
    refused = [t.error for t in mine if t.run_id is None]
    assert len(refused) == 3
    assert all(e is not None and "submit rate" in e for e in refused)
    # Another tenant's schedule is not held by acme's rate.
    assert [t.run_id is not None for t in ticks if t.tenant_id == "globex"] == [True]


async def test_child_runs_count_in_the_rate_and_the_quota(store: RunStore) -> None:
    await store.set_tenant_rates("default", "acme", 3, None)
    await store.enqueue("default", "acme", {})
    (lease,) = await store.claim("default", "w", 1)
    for i in range(2):  # the parent itself is the rate's first submit
        await store.submit_child(lease, {"i": i}, key=f"k{i}")
    with pytest.raises(Throttled) as refused:
        await store.submit_child(lease, {"i": 2}, key="k2")
    assert refused.value.code == "rate_limited"
    # The same child again is the child it was: no new submit, no refusal.
    again = await store.submit_child(lease, {"i": 0}, key="k0")
    assert again.input_json == {"i": 0}
    # The quota, with the rate out of the way.
    await store.set_tenant_rates("default", "acme", None, None)
    await store.set_queue_quotas("default", 100, {"acme": 2})
    with pytest.raises(Throttled) as full:
        await store.submit_child(lease, {"i": 3}, key="k3")
    assert full.value.code == "queue_full"


async def test_a_tenant_past_its_queue_quota_gets_429_on_every_api_path(
    api: Api, db_url: str
) -> None:
    """100,000 runs queued in 9.5 s with no quota; now every tenant has the
    pool's default (100,000) unless set, and a submit past it writes nothing."""
    response = await put_pool(api, {"default_max_pending": 3,
                                    "tenant_max_pending": {"globex": 5}})
    assert response.status_code == 200, response.text
    assert (response.json()["default_max_pending"], response.json()["tenant_max_pending"]) == (
        3, {"globex": 5})
    async with httpx.AsyncClient(base_url=api.url) as http:
        for _ in range(3):
            ok = await http.post("/v1/runs", json={"input": {}}, headers=api.headers("acme"))
            assert ok.status_code == 201, ok.text
        one = await http.post("/v1/runs", json={"input": {}}, headers=api.headers("acme"))
        batch = await http.post("/v1/runs/batch", json={"runs": [{"input": {}}]},
                                headers=api.headers("acme"))
        by_admin = await http.post("/v1/runs", json={"input": {}, "tenant_id": "acme"},
                                   headers=api.headers("admin"))
        for refused in (one, batch, by_admin):
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "queue_full"
            assert int(refused.headers["Retry-After"]) >= 1
        # Others are not held by acme's queue; a tenant's own quota beats the default.
        other = [await http.post("/v1/runs", json={"input": {}}, headers=api.headers("globex"))
                 for _ in range(6)]
        assert [r.status_code for r in other] == [201] * 5 + [429]
    assert count(db_url, "acme") == 3


async def test_a_batch_that_would_pass_the_quota_writes_nothing(api: Api, db_url: str) -> None:
    assert (await put_pool(api, {"default_max_pending": 3})).status_code == 200
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        ok = await http.post("/v1/runs", json={"input": {}})
        refused = await http.post("/v1/runs/batch", json={"runs": [{"input": {}}] * 3})
        fits = await http.post("/v1/runs/batch", json={"runs": [{"input": {}}] * 2})
    assert (ok.status_code, refused.status_code, fits.status_code) == (201, 429, 201)
    assert count(db_url, "acme") == 3


async def test_schedules_and_quota_and_room_again_once_runs_leave_the_queue(
    store: RunStore, clock: ManualClock
) -> None:
    await store.set_queue_quotas("default", 1, {})
    await store.create_schedule("acme", "a", EVERY_5, {"input": {}})
    await store.create_schedule("acme", "b", EVERY_5, {"input": {}})
    clock.advance(3 * 60)
    ticks = await store.fire_due_schedules()
    assert sorted(t.run_id is None for t in ticks) == [False, True]
    assert any(t.error is not None and "quota" in t.error for t in ticks)
    # The waiting run is claimed: the tenant has room again.
    (lease,) = await store.claim("default", "w", 1)
    await store.ack(lease, None)
    async with store.connection() as conn:
        assert (await store.admit("default", "acme", 1, conn=conn)).n == 1


@pytest.mark.parametrize("body", [
    {"default_max_pending": -1}, {"default_max_pending": 10**9}, {"default_max_pending": "5"},
    {"default_max_pending": 1.5}, {"tenant_max_pending": {"acme": -1}},
    {"tenant_max_pending": {"": 1}}, {"tenant_max_pending": {"acme": True}},
])
async def test_bad_quotas_are_refused(api: Api, body: dict[str, Any]) -> None:
    response = await put_pool(api, body)
    assert response.status_code == 422, response.text


async def test_a_pool_has_the_default_quota_and_null_means_none(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        pool = (await http.get("/v1/pools/default")).json()
    assert pool["default_max_pending"] == 100_000
    response = await put_pool(api, {"default_max_pending": None})
    assert response.json()["default_max_pending"] is None


async def test_an_agent_over_its_rate_is_retried_after_the_wait(
    live_store: RunStore, db_url: str
) -> None:
    """In agent code, ctx.submit_child past the rate raises a RetryableError
    (code rate_limited, retry after the rate's wait): uncaught, the parent
    waits for its next attempt, as a client does after a 429."""
    await live_store.set_tenant_rates("default", "acme", 2, None)

    async def agent(ctx: Any) -> None:
        for i in range(3):
            await ctx.submit_child({"i": i}, key=f"c{i}")

    parent = (await live_store.enqueue("default", "acme", {})).run.id

    async def retried() -> Any:
        run = await live_store.get(parent)
        return run if run.error_code is not None else None

    async with running_worker(db_url, agent=agent):
        run = await until(retried, timeout_s=30, what="the parent's refused child")
    assert (run.status, run.error_code, run.attempts) == ("pending", "rate_limited", 1)
    assert run.available_at > run.created_at  # not before the rate's wait
    assert count(db_url, "acme") == 2  # the parent and one child
