"""Child runs: submitted by a run (ctx.submit_child) or through the API
(parent_run_id, same tenant only), listed by parent, waited for without a
worker slot (ctx.wait_children), cancelled with their parent."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from uuid import uuid4

import httpx
import pytest
from click.testing import CliRunner

from runlease.cli import main as cli
from runlease.client import AsyncClient, NotFound, RunView
from runlease.db.store import RunStore
from runlease.errors import LeaseLost
from tests.support import agents
from tests.support.api import Api
from tests.support.waiting import until
from tests.support.workers import running_worker


async def test_a_parent_with_20_children_holds_no_worker_slot_while_it_waits(
    api: Api, db_url: str, live_store: RunStore
) -> None:
    """One worker with ONE slot: the 20 children can only run if the waiting
    parent gave its slot back. It did, without an attempt charged, and was
    run again when they had all finished."""
    async with AsyncClient(api.url, api.token("acme")) as client, \
            running_worker(db_url, agents.family, concurrency=1):
        parent = await client.submit({"children": 20, "sleep": 0.05}, max_attempts=1)

        async def waiting() -> RunView | None:
            run = await client.get(parent.id)
            return run if run.awaiting_children else None
        seen = await until(waiting, what="the parent to wait for its children")
        assert (seen.status, seen.lease) == ("pending", None)
        # While it waits, its children hold the one slot.
        async def a_child_leased() -> bool:
            page = await client.list(parent_run_id=parent.id, status="leased", limit=5)
            return bool(page.items)
        await until(a_child_leased, what="a child to run while the parent waits")
        final = await client.wait(parent.id, timeout_s=60)
        children = await client.list(parent_run_id=parent.id, limit=50)
    assert final.status == "done", final.error_message
    assert final.attempts == 1  # waiting charged no attempt (max_attempts is 1)
    assert final.result is not None
    assert final.result["children"] == list(range(20))
    assert final.result["statuses"] == ["done"] * 20
    assert final.result["attempt"] == 1
    assert len(children.items) == 20
    assert {c.parent_run_id for c in children.items} == {parent.id}
    assert {c.tenant_id for c in children.items} == {"acme"}
    # Each child submitted once: the second run of the parent replayed its steps.
    assert sorted(final.result["ids"]) == sorted(str(c.id) for c in children.items)
    kinds = [e.kind for e in await live_store.events_after(parent.id)]
    assert kinds == ["run.waiting", "run.children_finished"]


async def test_children_through_the_api_are_the_same_tenants_only(api: Api) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            AsyncClient(api.url, api.token("globex")) as globex, \
            AsyncClient(api.url, api.token("admin")) as admin:
        parent = await acme.submit({"steps": []})
        child = await acme.submit({"steps": []}, parent_run_id=parent.id)
        assert child.parent_run_id == parent.id
        assert (await acme.get(child.id)).parent_run_id == parent.id
        by_admin = await admin.submit({"steps": []}, tenant_id="acme", parent_run_id=parent.id)
        assert by_admin.parent_run_id == parent.id
        # Another tenant's run is no parent: 404, as reading it would be.
        with pytest.raises(NotFound):
            await globex.submit({"steps": []}, parent_run_id=parent.id)
        with pytest.raises(NotFound):
            await acme.submit({"steps": []}, parent_run_id=uuid4())
        assert (await globex.list(parent_run_id=parent.id)).items == []
        listed = await acme.list(parent_run_id=parent.id)
        assert sorted(r.id for r in listed.items) == sorted([child.id, by_admin.id])
        async with httpx.AsyncClient(base_url=api.url) as http:
            # An admin naming a tenant other than the parent's: 422.
            wrong = await http.post("/v1/runs", headers=api.headers("admin"), json={
                "input": {}, "tenant_id": "globex", "parent_run_id": str(parent.id)})
            assert wrong.status_code == 422, wrong.text
            assert wrong.json()["error"]["field"] == "parent_run_id"
            bad = await http.post("/v1/runs", headers=api.headers("acme"), json={
                "input": {}, "parent_run_id": "not-a-uuid"})
            assert bad.status_code == 422
            # A finished parent takes no child.
            await acme.cancel(parent.id)
            late = await http.post("/v1/runs", headers=api.headers("acme"), json={
                "input": {}, "parent_run_id": str(parent.id)})
            assert late.status_code == 422, late.text
    # The cancel reached the children.
    async with AsyncClient(api.url, api.token("acme")) as acme:
        statuses = {r.status for r in (await acme.list(parent_run_id=parent.id)).items}
    assert statuses == {"cancelled"}


async def test_cancelling_a_waiting_parent_cancels_its_running_children(
    api: Api, db_url: str
) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client, \
            running_worker(db_url, agents.family, concurrency=3):
        parent = await client.submit({"children": 5, "sleep": 600})

        async def running() -> bool:
            page = await client.list(parent_run_id=parent.id, status="leased")
            run = await client.get(parent.id)
            return run.awaiting_children and len(page.items) == 3
        await until(running, what="the parent waiting, three children running")
        cancelled = await client.cancel(parent.id)
        assert cancelled.status == "cancelled"  # it was pending: at once

        async def all_cancelled() -> list[Any] | None:
            items = (await client.list(parent_run_id=parent.id)).items
            return items if {c.status for c in items} == {"cancelled"} else None
        children = await until(all_cancelled, what="every child to be cancelled")
    assert len(children) == 5


async def test_submit_child_is_fenced_and_idempotent(live_store: RunStore) -> None:
    await live_store.enqueue("default", "acme", {"steps": []})
    (lease,) = await live_store.claim("default", "w", 1)
    one = await live_store.submit_child(lease, {"x": 1}, key="a")
    again = await live_store.submit_child(lease, {"x": 1}, key="a")
    assert one.id == again.id
    assert (one.parent_run_id, one.tenant_id) == (lease.run_id, "acme")
    await live_store.nack(lease, "flaky", "again")
    with pytest.raises(LeaseLost):
        await live_store.submit_child(lease, {"x": 2}, key="b")
    assert [c.id for c in await live_store.list_children(lease.run_id)] == [one.id]
    assert await live_store.list_children(lease.run_id, tenant_id="globex") == []


async def test_runlease_runs_children_lists_them(api: Api) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme:
        parent = await acme.submit({"steps": []})
        child = await acme.submit({"steps": []}, parent_run_id=parent.id)
    result = await asyncio.to_thread(CliRunner().invoke, cli, [
        "runs", "children", str(parent.id), "--api-url", api.url, "--token",
        api.token("acme"), "--json"])
    assert result.exit_code == 0, result.output
    assert [i["id"] for i in json.loads(result.stdout)["items"]] == [str(child.id)]


async def test_runlease_runs_show_lists_the_children(api: Api) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme:
        parent = await acme.submit({"steps": []})
        child = await acme.submit({"steps": []}, parent_run_id=parent.id)
    result = await asyncio.to_thread(CliRunner().invoke, cli, [
        "runs", "show", str(parent.id), "--api-url", api.url, "--token", api.token("acme"),
        "--wide"])
    assert result.exit_code == 0, result.output
    assert "children" in result.stdout
    assert str(child.id) in result.stdout
