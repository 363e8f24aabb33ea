"""Tenant rates per pool: submits per minute (HTTP 429 with Retry-After,
exact under concurrent submits) and model tokens per minute (checked inside
runlease_claim: a tenant over it waits while others proceed, across workers)."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest
from click.testing import CliRunner

from runlease.cli import main as cli
from runlease.client import ApiError, AsyncClient
from runlease.db.models import Pool, TenantLimit
from runlease.db.store import RunStore
from runlease.errors import ValidationError
from tests.support.api import Api
from tests.support.waiting import until
from tests.support.workers import running_worker


async def put_rates(api: Api, pool: str, rates: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        return await http.put(f"/v1/pools/{pool}", json={"tenant_rates": rates})


def count_runs(db_url: str, tenant: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM agent_runs WHERE tenant_id = %s",
                           (tenant,)).fetchone()
    assert row is not None
    return int(row[0])


async def test_submits_over_the_rate_are_a_429_with_retry_after(api: Api, db_url: str) -> None:
    response = await put_rates(api, "default", {"acme": {"submits_per_minute": 3}})
    assert response.status_code == 200, response.text
    assert response.json()["tenant_rates"] == {
        "acme": {"submits_per_minute": 3, "tokens_per_minute": None}}
    async with httpx.AsyncClient(base_url=api.url) as http:
        for _ in range(3):
            ok = await http.post("/v1/runs", json={"input": {}}, headers=api.headers("acme"))
            assert ok.status_code == 201, ok.text
        refused = await http.post("/v1/runs", json={"input": {}}, headers=api.headers("acme"))
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "rate_limited"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        # An admin submitting for the tenant is held to the tenant's rate too.
        by_admin = await http.post("/v1/runs", json={"input": {}, "tenant_id": "acme"},
                                   headers=api.headers("admin"))
        assert by_admin.status_code == 429
        # Another tenant, and another pool, are not limited.
        other = await http.post("/v1/runs", json={"input": {}}, headers=api.headers("globex"))
        assert other.status_code == 201
    assert count_runs(db_url, "acme") == 3  # nothing written for the refused ones
    async with AsyncClient(api.url, api.token("acme")) as client:
        with pytest.raises(ApiError) as caught:
            await client.submit({})
    assert (caught.value.status, caught.value.code) == (429, "rate_limited")


async def test_concurrent_submits_cannot_pass_the_rate_together(api: Api, db_url: str) -> None:
    assert (await put_rates(api, "default", {"acme": {"submits_per_minute": 4}})).status_code \
        == 200
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        answers = await asyncio.gather(*(http.post("/v1/runs", json={"input": {"i": i}})
                                         for i in range(12)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] * 4 + [429] * 8
    assert count_runs(db_url, "acme") == 4


@pytest.mark.parametrize("rate", [
    {"submits_per_minute": 0}, {"submits_per_minute": -1}, {"submits_per_minute": 10**6},
    {"tokens_per_minute": 0}, {"tokens_per_minute": 10**13}, {"tokens_per_minute": "1"},
    {"tokens_per_minute": 1.5}, {"burst": 3},
])
async def test_bad_rates_are_a_422(api: Api, rate: dict[str, Any]) -> None:
    response = await put_rates(api, "default", {"acme": rate})
    assert response.status_code == 422, response.text


async def test_the_store_refuses_bad_rates(live_store: RunStore) -> None:
    with pytest.raises(ValidationError):
        await live_store.set_tenant_rates("default", "acme", 0, None)
    with pytest.raises(ValidationError):
        await live_store.replace_tenant_limits("default", {"acme": TenantLimit(
            tokens_per_minute=-5)})
    await live_store.set_tenant_rates("default", "acme", 5, 1000)
    assert (await live_store.tenant_settings("default"))["acme"] == TenantLimit(
        submits_per_minute=5, tokens_per_minute=1000)
    await live_store.set_tenant_rates("default", "acme", None, None)
    assert await live_store.tenant_settings("default") == {}  # an empty row is pruned


async def test_runlease_pools_upsert_sets_rates(api: Api) -> None:
    def run(*args: str) -> Any:
        result = CliRunner().invoke(cli, [*args, "--api-url", api.url,
                                          "--token", api.token("admin"), "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    pool = await asyncio.to_thread(run, "pools", "upsert", "default", "--rate", "acme=60/-",
                                   "--rate", "globex=-/5000", "--limit", "acme=2")
    assert pool["tenant_rates"] == {
        "acme": {"submits_per_minute": 60, "tokens_per_minute": None},
        "globex": {"submits_per_minute": None, "tokens_per_minute": 5000}}
    pool = await asyncio.to_thread(run, "pools", "set", "default", "--rate", "acme=none")
    assert pool["tenant_rates"] == {
        "globex": {"submits_per_minute": None, "tokens_per_minute": 5000}}
    assert pool["tenant_limits"] == {"acme": 2}


async def spend(store: RunStore, pool: str, tenant: str, tokens: int) -> None:
    """A run of the tenant that reported `tokens` model tokens, now done."""
    await store.enqueue(pool, tenant, {"steps": []})
    (lease,) = await store.claim(pool, "spender", 1)
    await store.record_usage(lease, input_tokens=tokens)
    await store.ack(lease, None)


async def statuses(store: RunStore, ids: list[UUID]) -> list[tuple[str, int]]:
    return [((run := await store.get(i)).status.value, run.attempts) for i in ids]


async def test_a_tenant_over_its_token_rate_waits_while_others_proceed(
    live_store: RunStore, db_url: str
) -> None:
    store = live_store
    await store.put_pool(Pool("rated"), {"acme": TenantLimit(tokens_per_minute=100)})
    await spend(store, "rated", "acme", 150)
    acme = [(await store.enqueue("rated", "acme", {"steps": []})).run.id for _ in range(4)]
    globex = [(await store.enqueue("rated", "globex", {"steps": []})).run.id
              for _ in range(4)]
    async with running_worker(db_url, pool="rated") as one, \
            running_worker(db_url, pool="rated") as two:
        async def globex_done() -> bool:
            return all(s == "done" for s, _ in await statuses(store, globex))
        await until(globex_done, what="globex's runs to finish")
        # Both workers polled the pool meanwhile; acme's runs were never claimed.
        assert await statuses(store, acme) == [("pending", 0)] * 4
        assert one.identity != two.identity

        # The minute passes (the usage is moved back, not slept through).
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("UPDATE agent_run_usage_log "
                         "SET created_at = created_at - interval '61 seconds'")

        async def acme_done() -> bool:
            return all(s == "done" for s, _ in await statuses(store, acme))
        await until(acme_done, what="acme's runs to finish once its minute is under the rate")


async def test_a_token_rate_under_its_limit_does_not_hold_runs(
    live_store: RunStore
) -> None:
    store = live_store
    await store.put_pool(Pool("rated"), {"acme": TenantLimit(tokens_per_minute=1000)})
    await spend(store, "rated", "acme", 999)
    queued = await store.enqueue("rated", "acme", {"steps": []})
    claimed = await store.claim("rated", "w", 5)
    assert [c.run_id for c in claimed] == [queued.run.id]
    await store.record_usage(claimed[0], output_tokens=1)  # 1000: at the rate
    await store.enqueue("rated", "acme", {"steps": []})
    assert await store.claim("rated", "w", 5) == []


async def test_a_batch_over_the_submit_rate_is_a_429_and_writes_nothing(
    api: Api, db_url: str
) -> None:
    assert (await put_rates(api, "default", {"acme": {"submits_per_minute": 3}})).status_code \
        == 200
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        too_many = await http.post("/v1/runs/batch", json={"runs": [{"input": {"i": i}}
                                                                    for i in range(4)]})
        assert too_many.status_code == 429, too_many.text
        assert 1 <= int(too_many.headers["Retry-After"]) <= 60
        assert count_runs(db_url, "acme") == 0
        fits = await http.post("/v1/runs/batch", json={"runs": [{"input": {"i": i}}
                                                               for i in range(3)]})
        assert fits.status_code == 201, fits.text
        one_more = await http.post("/v1/runs", json={"input": {}})
        assert one_more.status_code == 429
    assert count_runs(db_url, "acme") == 3
