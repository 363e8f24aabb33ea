"""Bulk cancel and redrive (issue 15) through the HTTP API and the SDK:
by ids or by filter, dry runs, tenant scope, audit events."""

from __future__ import annotations

import asyncio
from uuid import UUID, uuid4

import httpx
import pytest

from runlease.client import ApiError, AsyncClient, Client, RunEnded, StreamEvent
from runlease.db.bulk import BULK_BATCH
from runlease.db.run_search import RunFilter
from runlease.db.store import NewRun, RunStore
from tests.support.api import Api


async def _kill(store: RunStore, pool: str, n: int) -> list[UUID]:
    """n runs of the pool, each claimed and failed: dead."""
    leases = await store.claim(pool, "test-worker", n)
    for lease in leases:
        await store.fail(lease, "refused", "no")
    return [lease.run_id for lease in leases]


async def test_a_tenants_filter_never_touches_another_tenants_runs(
    api: Api, live_store: RunStore
) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            AsyncClient(api.url, api.token("globex")) as globex:
        mine = [(await acme.submit({"n": i})).id for i in range(3)]
        theirs = [(await globex.submit({"n": i})).id for i in range(2)]
        counted = await acme.bulk_cancel(status=["pending"], dry_run=True)
        assert (counted.matched, counted.affected, counted.ids) == (3, 0, [])
        # Naming another tenant's ids matches nothing, like ids that do not exist.
        named = await acme.bulk_cancel(ids=[*theirs, uuid4()])
        assert (named.matched, named.affected) == (0, 0)
        done = await acme.bulk_cancel(status=["pending", "leased"])
        assert (done.matched, done.affected) == (3, 3)
        assert sorted(done.ids) == sorted(mine)
        assert {(await acme.get(i)).status for i in mine} == {"cancelled"}
        assert {(await globex.get(i)).status for i in theirs} == {"pending"}
        again = await acme.bulk_cancel(status=["pending"])  # finished runs: left alone
        assert (again.matched, again.affected) == (0, 0)
    events = await live_store.events_after(mine[0])
    assert [(e.kind, e.data) for e in events] == [
        ("run.cancelled", {"bulk_op": str(done.op_id), "by": "tenant:acme"})]
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        other = await http.post("/v1/runs/cancel", json={"filter": {"tenant_id": "globex"}})
    assert other.status_code == 403, other.text
    assert other.json()["error"]["field"] == "filter.tenant_id"


async def test_admin_narrows_to_a_tenant_and_a_pool(api: Api, live_store: RunStore) -> None:
    await live_store.enqueue_many("default", [NewRun("acme", {}), NewRun("globex", {})])
    async with AsyncClient(api.url, api.token("admin")) as admin:
        await admin.submit({}, tenant_id="globex")
        counted = await admin.bulk_cancel(tenant_id="globex", dry_run=True)
        assert counted.matched == 2
        elsewhere = await admin.bulk_cancel(tenant_id="globex", pool="other", dry_run=True)
        assert elsewhere.matched == 0
        done = await admin.bulk_cancel(tenant_id="globex")
        assert done.affected == 2
        left = await admin.list(status="pending")
    assert [r.tenant_id for r in left.items] == ["acme"]
    events = await live_store.events_after(done.ids[0])
    assert events[-1].data == {"bulk_op": str(done.op_id), "by": "admin"}


async def test_a_leased_run_gets_the_cancel_request(api: Api, live_store: RunStore) -> None:
    queued = await live_store.enqueue("default", "acme", {})
    (lease,) = await live_store.claim("default", "test-worker", 1)
    async with AsyncClient(api.url, api.token("acme")) as acme:
        done = await acme.bulk_cancel(ids=[queued.run.id])
        run = await acme.get(queued.run.id)
    assert done.affected == 1
    assert (run.status, run.cancel_requested_at is not None) == ("leased", True)
    assert lease.run_id == run.id


async def test_bulk_redrive_by_ids_and_by_filter(api: Api, live_store: RunStore) -> None:
    await live_store.enqueue_many("default", [NewRun("acme", {"n": i}) for i in range(3)])
    await live_store.enqueue("default", "globex", {})
    dead = await _kill(live_store, "default", 4)
    acme_dead = [i for i in dead if (await live_store.get(i)).tenant_id == "acme"]
    async with AsyncClient(api.url, api.token("admin")) as admin:
        one = await admin.bulk_redrive(ids=acme_dead[:1])
        assert (one.matched, one.affected) == (1, 1)
        counted = await admin.bulk_redrive(status=["dead"], tenant_id="acme", dry_run=True)
        assert counted.matched == 2
        rest = await admin.bulk_redrive(status=["dead", "pending"],  # only dead ones apply
                                        tenant_id="acme")
        assert rest.affected == 2
        runs = [await admin.get(i) for i in acme_dead]
    assert {(r.status, r.attempts) for r in runs} == {("pending", 0)}
    globex_dead = next(i for i in dead if i not in acme_dead)
    assert (await live_store.get(globex_dead)).status == "dead"
    kinds = [e.kind for e in await live_store.events_after(acme_dead[0])]
    assert kinds == ["run.dead", "run.redriven"]


async def test_by_filter_works_through_several_batches(live_store: RunStore) -> None:
    n = BULK_BATCH * 2 + 7
    await live_store.enqueue_many("default", [NewRun("acme", {"n": i}) for i in range(n)])
    await live_store.enqueue("default", "globex", {})
    counted = await live_store.bulk_action("cancel", by="test",
                                           where=RunFilter(tenant_id="acme"), dry_run=True)
    assert counted.matched == n
    done = await live_store.bulk_action("cancel", by="test", where=RunFilter(tenant_id="acme"))
    assert (done.matched, done.affected, len(done.ids)) == (n, n, 1000)
    assert (await live_store.list_runs(status="pending"))[0].tenant_id == "globex"


async def test_malformed_bulk_requests_are_4xx_naming_the_field(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        cases = [
            ({}, 422), ({"ids": [str(uuid4())], "filter": {}}, 422),
            ({"ids": []}, 422), ({"ids": [str(uuid4())] * 1001}, 422),
            ({"ids": ["nope"]}, 422), ({"filter": {"status": ["running"]}}, 422),
            ({"filter": {"pool": "Bad!"}}, 422), ({"filter": {}, "dry_run": "yes"}, 422),
            ({"ids": None}, 422), ({"filter": {"colour": "red"}}, 422),
        ]
        for body, status in cases:
            response = await http.post("/v1/runs/redrive", json=body,
                                       headers=api.headers("admin"))
            assert response.status_code == status, (body, response.text)
        unsent = await http.post("/v1/runs/cancel", content=b"{}")
        assert unsent.status_code == 415


async def test_the_sync_client(api: Api) -> None:
    def run() -> None:
        with Client(api.url, api.token("acme")) as acme:
            ids = [acme.submit({}).id for _ in range(2)]
            assert acme.bulk_cancel(ids, dry_run=True).matched == 2
            assert acme.bulk_cancel(ids).affected == 2
            with pytest.raises(ApiError, match="admin only"):
                acme.bulk_redrive(status=["dead"])
        with Client(api.url, api.token("admin")) as admin:
            assert admin.bulk_redrive(status=["dead"]).matched == 0

    await asyncio.to_thread(run)


@pytest.mark.parametrize("path", ["/v1/runs/cancel", "/v1/runs/redrive"])
async def test_bulk_routes_are_in_the_openapi_document_with_examples(api: Api,
                                                                     path: str) -> None:
    async with httpx.AsyncClient(base_url=api.url) as http:
        spec = (await http.get("/openapi.json")).json()
    assert "post" in spec["paths"][path]
    body = spec["components"]["schemas"]["BulkIn"]
    assert body["oneOf"] == [{"required": ["ids"]}, {"required": ["filter"]}]
    assert body["properties"]["ids"]["type"] == "array"
    status = spec["components"]["schemas"]["RunFilterIn"]["properties"]["status"]
    assert status["examples"] == [["pending", "leased"]]


async def test_cancel_every_run_of_a_broken_agent_version(api: Api,
                                                         live_store: RunStore) -> None:
    """The issue's on-call case: a label filter, tenant-scoped."""
    await live_store.enqueue_many("default", [
        NewRun("acme", {"n": i}, labels={"agent_version": "1.4.2" if i % 2 else "1.4.1"})
        for i in range(6)])
    await live_store.enqueue("default", "globex", {}, labels={"agent_version": "1.4.2"})
    async with AsyncClient(api.url, api.token("acme")) as acme:
        counted = await acme.bulk_cancel(label=["agent_version:1.4.2"], dry_run=True)
        assert counted.matched == 3
        done = await acme.bulk_cancel(label=["agent_version:1.4.2"], status=["pending"])
    assert done.affected == 3
    left = {(r.tenant_id, r.labels["agent_version"], r.status)
            for r in await live_store.list_runs(limit=50)}
    assert left == {("acme", "1.4.1", "pending"), ("acme", "1.4.2", "cancelled"),
                    ("globex", "1.4.2", "pending")}


async def test_the_streams_of_bulk_touched_runs_are_woken(api: Api) -> None:
    # The API reads a followed run only when notified (api/fanout.py): a bulk
    # action's events and ends must reach the streams without another write.
    async with AsyncClient(api.url, api.token("acme")) as acme:
        moved = await acme.submit({"i": 0})
        stopped = await acme.submit({"i": 1})

        async def first_event(run_id: UUID) -> StreamEvent:
            async for item in acme.events(run_id):
                if isinstance(item, StreamEvent):
                    return item
            raise AssertionError("the stream ended without an event")

        async def to_the_end(run_id: UUID) -> list[object]:
            return [item async for item in acme.events(run_id)]

        seen = asyncio.create_task(first_event(moved.id))
        ended = asyncio.create_task(to_the_end(stopped.id))
        await asyncio.sleep(0.5)  # both streams are open and idle
        await acme.reprioritize(moved.id, 5)
        await acme.bulk_cancel([stopped.id])
        event = await asyncio.wait_for(seen, 10)
        items = await asyncio.wait_for(ended, 10)
    assert event.kind == "run.reprioritized"
    assert items[-1] == RunEnded("cancelled", None, 0)


async def test_a_tenant_cannot_redrive_in_bulk_as_it_cannot_one_run(
    api: Api, live_store: RunStore
) -> None:
    """Issue 32: single redrive was admin only, bulk redrive was not, so a
    tenant reset the attempts of its own dead runs past max_attempts."""
    await live_store.enqueue("default", "acme", {})
    (dead,) = await _kill(live_store, "default", 1)
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        by_ids = await http.post("/v1/runs/redrive", json={"ids": [str(dead)]})
        by_filter = await http.post("/v1/runs/redrive", json={"filter": {"status": ["dead"]}})
        one = await http.post(f"/v1/runs/{dead}/redrive")
    assert [r.status_code for r in (by_ids, by_filter, one)] == [403, 403, 403]
    assert (await live_store.get(dead)).status == "dead"
