"""Usage and budgets across attempts: usage summed per run, a budget that
survives a retry, the deadline since submit, hostile usage values, and
GET /v1/usage for a tenant and for an admin (HTTP and both SDKs)."""

from __future__ import annotations

import asyncio
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from runlease.cli import main as cli
from runlease.client import AsyncClient, Client
from runlease.db.models import Lease
from runlease.db.store import RunStore
from runlease.errors import LeaseLost, ValidationError
from tests.support import agents
from tests.support.api import Api
from tests.support.waiting import until
from tests.support.workers import running_worker


async def leased(store: RunStore, tenant: str, budget: dict[str, Any] | None = None) -> Lease:
    await store.enqueue("default", tenant, {"steps": []}, budget=budget)
    (lease,) = await store.claim("default", f"w-{tenant}", 1)
    return lease


async def test_a_budget_survives_a_retry(api: Api, db_url: str) -> None:
    """Attempt 1 spends 60 tokens and fails retryably; attempt 2 starts with
    40 left: it sees 90 after spending 30, and is stopped budget_exceeded when
    the next 30 take it over 100 (the step after never runs)."""
    steps = [{"usage": {"input_tokens": 60, "cost": 0.5}},
             {"fail": "retryable", "until_attempt": 2},
             {"usage": {"output_tokens": 30}},
             {"usage": {"output_tokens": 30}},
             {"emit": {"never": True}}]
    async with AsyncClient(api.url, api.token("acme")) as client, running_worker(db_url):
        run = await client.submit({"steps": steps}, max_attempts=3,
                                  budget={"max_tokens": 100, "max_cost": 10})
        final = await client.wait(run.id, timeout_s=60)
        page = await client.steps(run.id)
    assert (final.status, final.error_code, final.attempts) == ("dead", "budget_exceeded", 2)
    assert final.error_message is not None
    assert "max_tokens of 100" in final.error_message
    assert final.usage is not None
    assert (final.usage["input_tokens"], final.usage["output_tokens"]) == (60, 60)
    assert final.usage["cost"] == 0.5
    by_key = {s.key: s.result for s in page.items}
    assert by_key["0"]["attempt"] == 1
    assert by_key["0"]["usage"]["input_tokens"] == 60
    # Attempt 2 resumed with what attempt 1 left: 60 + 30.
    assert by_key["2"]["attempt"] == 2
    assert by_key["2"]["usage"]["input_tokens"] + by_key["2"]["usage"]["output_tokens"] == 90
    assert "3" not in by_key
    assert "4" not in by_key


async def test_a_cost_budget_ends_the_run_at_once(api: Api, db_url: str) -> None:
    steps = [{"usage": {"cost": 0.75}}, {"usage": {"cost": 0.5}}, {"emit": {"never": True}}]
    async with AsyncClient(api.url, api.token("acme")) as client, running_worker(db_url):
        run = await client.submit({"steps": steps}, max_attempts=3, budget={"max_cost": 1})
        final = await client.wait(run.id, timeout_s=30)
    assert (final.status, final.error_code, final.attempts) == ("dead", "budget_exceeded", 1)
    assert final.usage is not None
    assert final.usage["cost"] == 1.25


async def test_the_deadline_counts_from_submit_and_is_checked_at_claim(
    live_store: RunStore, db_url: str
) -> None:
    queued = await live_store.enqueue("default", "acme", {"steps": [{"emit": {"ran": True}}]},
                                      budget={"deadline_s": 0.5})
    await asyncio.sleep(1.0)  # the run waits in the queue past its deadline
    async with running_worker(db_url):
        async def dead() -> Any:
            run = await live_store.get(queued.run.id)
            return run if run.status == "dead" else None
        run = await until(dead, what="the run to be dead")
    assert (run.error_code, run.attempts) == ("budget_exceeded", 1)
    assert "since submit" in (run.error_message or "")
    assert [e.kind for e in await live_store.events_after(run.id)] == ["run.dead"]


@pytest.mark.parametrize("usage", [
    {"input_tokens": -1}, {"output_tokens": -5}, {"cost": -0.01}, {"cost": math.nan},
    {"cost": math.inf}, {"input_tokens": 10**12}, {"cost": 1e12}, {"input_tokens": True},
    {"input_tokens": 1.5}, {"cost": "1"}, {"output_tokens": None},
])
async def test_hostile_usage_values_are_refused_and_write_nothing(
    live_store: RunStore, usage: dict[str, Any]
) -> None:
    lease = await leased(live_store, "acme")
    with pytest.raises(ValidationError):
        await live_store.record_usage(lease, **usage)
    run = await live_store.get(lease.run_id)
    assert (run.input_tokens, run.output_tokens, float(run.cost)) == (0, 0, 0.0)
    assert await live_store.usage_report(start=datetime.now(UTC).date(),
                                         end=datetime.now(UTC).date(), group_by="tenant") == []


async def test_a_hostile_usage_step_ends_the_run_with_a_clear_code(
    api: Api, db_url: str
) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client, running_worker(db_url):
        run = await client.submit({"steps": [{"usage": {"input_tokens": -3}}]})
        final = await client.wait(run.id, timeout_s=30)
    assert (final.status, final.error_code) == ("dead", "invalid_usage")


@pytest.mark.parametrize("budget", [
    {"max_tokens": 0}, {"max_tokens": -1}, {"max_tokens": 10**13}, {"max_tokens": 1.5},
    {"max_cost": 0}, {"max_cost": -1}, {"max_cost": 1e10}, {"max_cost": "1"},
    {"max_cost": True},
])
async def test_bad_budgets_are_a_422(api: Api, budget: dict[str, Any]) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        response = await http.post("/v1/runs", json={"input": {}, "budget": budget})
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
async def test_a_nan_cost_budget_is_a_422(api: Api, value: str) -> None:
    body = f'{{"input": {{}}, "budget": {{"max_cost": {value}}}}}'
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        response = await http.post("/v1/runs", content=body,
                                   headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text


async def test_usage_is_summed_per_run_across_attempts(live_store: RunStore) -> None:
    lease = await leased(live_store, "acme")
    await live_store.record_usage(lease, input_tokens=10, output_tokens=2, cost=0.25)
    await live_store.nack(lease, "flaky", "try again")
    run = await live_store.get(lease.run_id)
    assert (run.input_tokens, run.output_tokens, float(run.cost)) == (10, 2, 0.25)
    # The old attempt's lease is gone: its usage is refused (fenced).
    with pytest.raises(LeaseLost):
        await live_store.record_usage(lease, input_tokens=1)


async def _spend(store: RunStore) -> None:
    acme = await leased(store, "acme")
    await store.record_usage(acme, input_tokens=100, output_tokens=10, cost=1.5)
    await store.record_usage(acme, input_tokens=50, output_tokens=5, cost=0.5)
    globex = await leased(store, "globex")
    await store.record_usage(globex, input_tokens=7, output_tokens=3, cost=0.25)


async def test_usage_api_for_a_tenant_and_for_an_admin(api: Api, live_store: RunStore) -> None:
    await _spend(live_store)
    today = datetime.now(UTC).date()

    async with httpx.AsyncClient(base_url=api.url) as http:
        async def get(who: str, **params: Any) -> httpx.Response:
            return await http.get("/v1/usage", params=params, headers=api.headers(who))

        mine = (await get("acme", group_by="tenant")).json()
        assert mine["from"] == mine["to"] == today.isoformat()
        assert [(i["key"], i["input_tokens"], i["output_tokens"], i["tokens"], i["cost"],
                 i["records"]) for i in mine["items"]] == [("acme", 150, 15, 165, 2.0, 2)]
        theirs = (await get("globex", group_by="day")).json()["items"]
        assert [(i["key"], i["tokens"]) for i in theirs] == [(today.isoformat(), 10)]
        # A tenant never sees another tenant's usage.
        refused = await get("acme", tenant_id="globex")
        assert refused.status_code == 403
        assert refused.json()["error"]["field"] == "tenant_id"
        everyone = (await get("admin", group_by="tenant")).json()["items"]
        assert [(i["key"], i["tokens"]) for i in everyone] == [("acme", 165), ("globex", 10)]
        one = (await get("admin", group_by="pool", tenant_id="globex")).json()["items"]
        assert [(i["key"], i["tokens"]) for i in one] == [("default", 10)]
        assert (await get(None, group_by="tenant")).status_code == 401  # type: ignore[arg-type]
        for bad in ({"group_by": "run"}, {"from": "2026-13-01"}, {"to": "yesterday"}):
            response = await get("admin", **bad)
            assert response.status_code == 422, (bad, response.text)
        # A span too long is its last 366 days; from after to covers no day.
        long = (await get("admin", group_by="tenant", **{"from": "2020-01-01"})).json()
        assert long["from"] == (today - timedelta(days=365)).isoformat()
        assert [(i["key"], i["tokens"]) for i in long["items"]] == [("acme", 165),
                                                                    ("globex", 10)]
        backwards = await get("admin", **{"from": today.isoformat(), "to": "2020-01-01"})
        assert (backwards.status_code, backwards.json()["items"]) == (200, [])

    # Folded into the daily rollup by the leader's reaper: the same answer.
    assert await live_store.usage_rollup(keep_s=0) == 3
    assert await live_store.usage_rollup(keep_s=0) == 0
    def sync_usage() -> dict[str, Any]:
        # The sync client, off the loop that serves the API.
        with Client(api.url, api.token("admin")) as client:
            return client.usage(group_by="tenant", start=today, end=today)

    report = await asyncio.to_thread(sync_usage)
    assert [(i["key"], i["tokens"], i["cost"], i["records"]) for i in report["items"]] == [
        ("acme", 165, 2.0, 2), ("globex", 10, 0.25, 1)]
    async with AsyncClient(api.url, api.token("acme")) as aclient:
        report = await aclient.usage(group_by="day")
    assert [(i["key"], i["tokens"]) for i in report["items"]] == [(today.isoformat(), 165)]
    assert json.dumps(report)  # plain JSON for scripts


async def test_runlease_usage_prints_a_tenants_usage(api: Api, live_store: RunStore) -> None:
    await _spend(live_store)

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["usage", *args, "--api-url", api.url,
                                        "--token", api.token("acme")])

    as_json = await asyncio.to_thread(run, "--group-by", "tenant", "--json")
    assert as_json.exit_code == 0, as_json.output
    assert [(i["key"], i["tokens"]) for i in json.loads(as_json.output)["items"]] == [
        ("acme", 165)]
    table = await asyncio.to_thread(run, "--group-by", "pool")
    assert table.exit_code == 0, table.output
    assert "default" in table.output
    assert "150" in table.output
    refused = await asyncio.to_thread(run, "--tenant", "globex")
    assert refused.exit_code == 1
    assert "403 forbidden" in refused.output


async def test_a_run_whose_budget_an_earlier_attempt_spent_ends_before_its_agent_runs(
    live_store: RunStore, db_url: str
) -> None:
    """Attempt 1 reported 150 of 100 tokens and its worker died before
    failing the run; the next claim ends it budget_exceeded at once."""
    queued = await live_store.enqueue("default", "acme", {"seconds": 0},
                                      budget={"max_tokens": 100}, max_attempts=3)
    (lease,) = await live_store.claim("default", "doomed", 1)
    await live_store.record_usage(lease, input_tokens=150)
    await live_store.release("doomed", [(lease.run_id, lease.epoch)])  # its attempt back
    async with running_worker(db_url, agents.sleepy):
        async def dead() -> Any:
            run = await live_store.get(queued.run.id)
            return run if run.status == "dead" else None
        run = await until(dead, what="the run to be dead")
    assert run.error_code == "budget_exceeded"
    assert "150 used" in (run.error_message or "")
    assert "started" not in [e.kind for e in await live_store.events_after(run.id)]
