"""Pool settings from the pool row, set through the API, the CLI and the store:
tenant priority bands, retention by each pool's window, the lease workers
use, the tool env a pool grants, a paused pool."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner

from runlease.cli import main as cli
from runlease.clock import ManualClock
from runlease.db.models import Pool, TenantLimit
from runlease.db.store import NewRun, RunStore
from runlease.errors import ValidationError
from runlease.services.leader import LeaderElector
from runlease.services.reaper import ReapBounds, Reaper
from runlease.worker.context import RunContext
from tests.support.api import Api
from tests.support.waiting import until
from tests.support.workers import running_worker

# -- priority bands through the HTTP API ------------------------------------------------


async def test_a_submit_outside_the_tenants_band_is_refused_with_422(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url) as http:
        put = await http.put("/v1/pools/default", headers=api.headers("admin"),
                             json={"tenant_priority": {"acme": {"min": -10, "max": 10}}})
        assert put.status_code == 200, put.text
        assert put.json()["tenant_priority"] == {"acme": {"min": -10, "max": 10}}

        async def submit(who: str, priority: int) -> httpx.Response:
            return await http.post("/v1/runs", headers=api.headers(who),
                                   json={"input": {}, "priority": priority})

        inside = [await submit("acme", p) for p in (-10, 0, 10)]
        assert [r.status_code for r in inside] == [201, 201, 201]
        assert [r.json()["priority"] for r in inside] == [-10, 0, 10]
        for priority in (11, 100, -11):
            outside = await submit("acme", priority)
            assert outside.status_code == 422, outside.text
            body = outside.json()
            assert body["error"]["field"] == "priority"
            assert "between -10 and 10" in body["error"]["message"]
        # Another tenant has no band: the whole range, as before.
        assert (await submit("globex", 100)).status_code == 201
        # Nothing outside the band was stored.
        listed = await http.get("/v1/runs", headers=api.headers("acme"))
        assert sorted(r["priority"] for r in listed.json()["items"]) == [-10, 0, 10]


async def test_a_band_is_refused_in_a_batch_too_and_nothing_is_written(store: RunStore) -> None:
    await store.set_tenant_priority_band("default", "acme", 0, 0)
    with pytest.raises(ValidationError) as caught:
        await store.enqueue_many("default", [NewRun("acme", {}), NewRun("acme", {}, priority=1)])
    assert caught.value.field == "runs[1].priority"
    assert await store.list_runs() == []
    # Removing the band restores the whole range; the cap is untouched.
    await store.set_tenant_limit("default", "acme", 2)
    await store.set_tenant_priority_band("default", "acme", None, None)
    assert (await store.enqueue("default", "acme", {}, priority=100)).inserted
    assert await store.tenant_settings("default") == {"acme": TenantLimit(2)}


# -- the pool PUT/GET: every setting, and what a hostile caller sends -------------------


async def test_pool_settings_round_trip_through_the_api(api: Api) -> None:
    body = {"max_attempts": 4, "lease_s": 30, "retention_s": 0, "paused": True,
            "tool_env": ["GITHUB_TOKEN", "HTTPS_PROXY"], "default_max_in_flight": 0,
            "tenant_limits": {"acme": 3}, "tenant_priority": {"globex": {"min": 0, "max": 5}},
            "tenant_rates": {"acme": {"submits_per_minute": 10, "tokens_per_minute": None},
                             "initech": {"submits_per_minute": None,
                                         "tokens_per_minute": 5000}},
            "default_max_pending": 50, "tenant_max_pending": {"acme": 7}}
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        put = await http.put("/v1/pools/batch", json=body)
        assert put.status_code == 200, put.text
        got = await http.get("/v1/pools/batch")
        missing = await http.get("/v1/pools/nope")
        tenant = await http.get("/v1/pools/batch", headers=api.headers("acme"))
    # `service` is read-only, of now (test_titles_and_unserved.py): the settings round-trip.
    assert got.json().pop("service") == put.json().pop("service") == {
        "live_workers": 0, "claimable": False, "unserved": False}
    assert ({k: v for k, v in got.json().items() if k != "service"}
            == {k: v for k, v in put.json().items() if k != "service"}
            == {"name": "batch", "priority_aging_s": 60, **body})
    assert missing.status_code == 404
    assert tenant.status_code == 403


HOSTILE_POOLS = [
    ({"tool_env": ["RUNLEASE_DATABASE_URL"]}, "tool_env[0]"),
    ({"tool_env": ["DATABASE_URL"]}, "tool_env[0]"),
    ({"tool_env": ["PGPASSWORD"]}, "tool_env[0]"),
    ({"tool_env": ["OK", "lower"]}, "tool_env[1]"),
    ({"tool_env": [""]}, "tool_env[0]"),
    ({"tool_env": ["A B"]}, "tool_env[0]"),
    ({"tool_env": ["X" * 129]}, "tool_env[0]"),
    ({"tool_env": ["A", "A"]}, "tool_env[1]"),
    ({"tool_env": [f"V{i}" for i in range(65)]}, "tool_env"),
    ({"tool_env": "GITHUB_TOKEN"}, "tool_env"),
    ({"retention_s": -1}, "retention_s"),
    ({"retention_s": 10**12}, "retention_s"),
    ({"paused": "yes"}, "paused"),
    ({"tenant_limits": {"acme": -1}}, "limits[acme]"),
    ({"tenant_limits": {"x" * 200: 1}}, "tenant_id"),
    ({"tenant_priority": {"acme": {"min": 5, "max": 1}}}, "limits[acme].priority_min"),
    ({"tenant_priority": {"acme": {"min": -101, "max": 1}}}, "tenant_priority.acme.min"),
    ({"tenant_priority": {"acme": {"lo": 1}}}, "tenant_priority.acme.lo"),
    ({"tenant_priority": {"acme": 3}}, "tenant_priority.acme"),
    # `service` is ignored, but only as the document says it (found by schemathesis: 0 for false).
    ({"service": {"live_workers": 0, "claimable": False, "unserved": 0}}, "service.unserved"),
    ({"service": {"live_workers": -1, "claimable": False, "unserved": False}},
     "service.live_workers"),
    ({"service": {"live_workers": 0, "claimable": False, "unserved": False, "x": 1}},
     "service.x"),
    ({"service": "served"}, "service"),
]


@pytest.mark.parametrize(("body", "field"), HOSTILE_POOLS,
                         ids=[f for _, f in HOSTILE_POOLS])
async def test_a_bad_pool_is_refused_with_422_and_changes_nothing(
    api: Api, db_url: str, body: dict[str, Any], field: str
) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        before = (await http.get("/v1/pools/default")).json()
        response = await http.put("/v1/pools/default", json=body)
        after = (await http.get("/v1/pools/default")).json()
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"].startswith(field), response.text
    assert after == before


# -- the CLI changes only what it is given ------------------------------------------------


async def cli_json(api: Api, *args: str) -> Any:
    result = await asyncio.to_thread(
        CliRunner().invoke, cli, [*args, "--api-url", api.url, "--token", api.token("admin"),
                                  "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


async def test_pools_upsert_changes_only_what_is_given(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        await http.put("/v1/pools/batch", json={
            "lease_s": 30, "retention_s": 100, "max_attempts": 7, "tool_env": ["HOME_API"],
            "default_max_in_flight": 4, "tenant_limits": {"globex": 1}})
    pool = await cli_json(api, "pools", "upsert", "batch", "--limit", "acme=3")
    assert (pool["lease_s"], pool["retention_s"], pool["max_attempts"], pool["tool_env"],
            pool["default_max_in_flight"]) == (30, 100, 7, ["HOME_API"], 4)
    assert pool["tenant_limits"] == {"acme": 3, "globex": 1}
    pool = await cli_json(api, "pools", "set", "batch", "--paused", "--limit", "globex=none",
                          "--priority", "acme=-5:5", "--default-max-in-flight", "none",
                          "--tool-env", "")
    assert (pool["paused"], pool["tenant_limits"], pool["tenant_priority"],
            pool["default_max_in_flight"], pool["tool_env"], pool["lease_s"]) == (
        True, {"acme": 3}, {"acme": {"min": -5, "max": 5}}, None, [], 30)
    # A new pool starts from the defaults.
    fresh = await cli_json(api, "pools", "upsert", "fresh", "--retention-s", "0")
    assert (fresh["lease_s"], fresh["retention_s"], fresh["paused"]) == (45, 0, False)


# -- the worker takes its lease from the pool -----------------------------------------------


async def hold(ctx: RunContext) -> None:
    await asyncio.Event().wait()  # until cancelled by the drain


async def test_a_worker_with_other_defaults_uses_the_pools_lease(
    live_store: RunStore, db_url: str
) -> None:
    store = live_store
    await store.upsert_pool(Pool("default", lease_s=20))
    # No lease given: the pool's (the worker's old default was 45, tests' 6).
    async with running_worker(db_url, hold, lease_s=0, heartbeat_interval_s=0,
                              drain_grace_s=0) as worker:
        assert (worker.settings.lease_s, worker.settings.heartbeat_interval_s) == (20, 20 / 3)
        assert worker.keeper.holder.lease_s == 20
        run = (await store.enqueue("default", "acme", {})).run

        async def leased() -> Any:
            with psycopg.connect(db_url) as conn:
                return conn.execute(
                    "SELECT w.expires_at - w.heartbeat_at, w.expires_at - now()"
                    "  FROM agent_runs r JOIN agent_run_workers w ON w.id = r.locked_by"
                    " WHERE r.id = %s AND r.status = 'leased'", (run.id,)).fetchone()

        lease_s, left = await until(leased, what="the run to be leased")
        # The holder's row: each renewal (and the registration) now + 20 s.
        assert lease_s == timedelta(seconds=20)
        assert left <= timedelta(seconds=20)
        async def started() -> Any:  # the claim commits before the worker records it
            return worker.held.get(run.id)

        handle = await until(started, what="the worker to hold the run")
        assert handle.terms.lease_s == 20
        # Its fence is its incarnation's: the last renewal's send time plus
        # the pool's lease, less the margin; sent before the claim.
        assert worker.keeper.holder.fence_after_s == 20 - worker.settings.margin_s
        assert handle.fence_at == handle.incarnation.fence_at
        assert handle.fence_at <= handle.claimed_at + 20 - worker.settings.margin_s


async def test_a_worker_deletes_by_the_pools_retention(live_store: RunStore,
                                                       db_url: str) -> None:
    store = live_store
    await store.upsert_pool(Pool("default", retention_s=1))
    await store.upsert_pool(Pool("kept", retention_s=0))
    short = await store.enqueue("default", "acme", {})
    kept = await store.enqueue("kept", "acme", {})
    for result in (short, kept):
        await store.request_cancel(result.run.id)  # finished: cancelled
    async with running_worker(db_url):
        async def gone() -> bool:
            return not await store.list_runs(pool="default")

        await until(gone, what="the pool's retention to delete its finished run")
    assert [r.id for r in await store.list_runs(pool="kept")] == [kept.run.id]


# -- retention by each pool's window, in batches ---------------------------------------------


async def test_retention_deletes_old_finished_runs_in_batches_and_nothing_else(
    store: RunStore, clock: ManualClock, db_url: str
) -> None:
    await store.upsert_pool(Pool("short", retention_s=3600))
    await store.upsert_pool(Pool("keep", retention_s=0))
    await store.upsert_pool(Pool("default"))  # 7 days
    await store.set_tenant_limit("short", "idle", 0)  # its pending run stays pending

    async def finished(pool: str, how: str, worker: str = "w") -> Any:
        run = (await store.enqueue(pool, "acme", {})).run
        if how == "cancelled":
            await store.request_cancel(run.id)
            return run.id
        (lease,) = await store.claim(pool, worker, 1, lease_s=3600)  # not reaped here
        await store.record_event(lease, "note", {"x": 1})
        await store.record_step(lease, "step", {"y": 2})
        if how == "done":
            await store.ack(lease, {"ok": True})
        elif how == "dead":
            await store.fail(lease, "broken", "x")
        return run.id

    doomed = [await finished("short", how) for how in ("done",) * 3 + ("dead",) * 2
              + ("cancelled",)]
    kept = [await finished("keep", "done"), await finished("default", "done"),
            (await store.enqueue("short", "idle", {})).run.id,   # pending, old
            await finished("short", "leased")]                   # leased, old
    clock.advance(7200)
    kept.append(await finished("short", "done", "w-young"))      # young

    elector = LeaderElector(store, "me")
    batches: list[int] = []
    while True:
        deleted = await store.delete_expired(batch=2)
        batches.append(sum(deleted.values()))
        assert set(deleted) <= {"short"}
        if not deleted:
            break
    assert batches == [2, 2, 2, 0]
    assert await Reaper(store, elector, bounds=ReapBounds(batch=2)).retain() == 0
    with psycopg.connect(db_url) as conn:
        left = {r[0] for r in conn.execute("SELECT id FROM agent_runs")}
        events = {r[0] for r in conn.execute("SELECT DISTINCT run_id FROM agent_run_events")}
        steps = {r[0] for r in conn.execute("SELECT run_id FROM agent_run_steps")}
        indexed = {r[0] for r in conn.execute("SELECT run_id FROM agent_run_tenant_index")}
    assert left == indexed == set(kept)
    assert not (events | steps) & set(doomed)
    assert {kept[0], kept[1], kept[3], kept[4]} <= steps


async def test_the_reaper_retains_by_pool_in_batches(store: RunStore, clock: ManualClock) -> None:
    await store.upsert_pool(Pool("short", retention_s=60))
    for _ in range(5):
        await store.request_cancel((await store.enqueue("short", "acme", {})).run.id)
    clock.advance(120)
    assert await Reaper(store, LeaderElector(store, "me"), bounds=ReapBounds(batch=2)).retain() == 5
    assert await store.list_runs() == []


# -- a paused pool ----------------------------------------------------------------------------


async def test_a_paused_pool_takes_runs_but_claims_none_and_leased_runs_go_on(
    store: RunStore,
) -> None:
    await store.enqueue_many("default", [NewRun("acme", {}) for _ in range(3)])
    (lease,) = await store.claim("default", "w", 1)
    await store.upsert_pool(Pool("default", paused=True))
    assert (await store.enqueue("default", "acme", {})).inserted
    assert await store.claim("default", "w", 10) == []
    assert await store.renew("w") is not None  # its holder renews as before
    await store.ack(lease)
    assert await store.claim("default", "w", 10) == []
    await store.upsert_pool(Pool("default", paused=False))
    assert len(await store.claim("default", "w", 10)) == 3
