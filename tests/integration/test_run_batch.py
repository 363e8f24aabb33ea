"""Bulk submit (POST /v1/runs/batch, SDK submit_many) and runs for later
(run_at / delay_s): order, idempotency, all or nothing, per-item errors,
bounds, tenant rules, and a delayed run costing a claim nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from runlease import metrics
from runlease.client import AsyncClient, Client
from runlease.clock import ManualClock
from runlease.db.models import Pool, TenantLimit
from runlease.db.store import NewRun, RunStore
from runlease.errors import BatchRefused, ValidationError
from tests.support.api import Api


def count_runs(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        return int(conn.execute("SELECT count(*) FROM agent_runs").fetchone()[0])  # type: ignore[index]


async def batch(http: httpx.AsyncClient, runs: list[dict[str, Any]]) -> httpx.Response:
    return await http.post("/v1/runs/batch", json={"runs": runs})


async def test_a_thousand_runs_in_order(api: Api, db_url: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        r = await batch(acme, [{"input": {"i": i}, "labels": {"n": str(i % 3)}}
                               for i in range(1000)])
    assert r.status_code == 201, r.text
    runs = r.json()["runs"]
    assert [run["input"]["i"] for run in runs] == list(range(1000))
    assert {run["tenant_id"] for run in runs} == {"acme"}
    assert runs[4]["labels"] == {"n": "1"}
    assert r.json()["created"] == [True] * 1000
    assert count_runs(db_url) == 1000
    with psycopg.connect(db_url) as conn:  # found by label, through the side table
        assert conn.execute("SELECT count(*) FROM agent_run_labels").fetchone() == (1000,)


async def test_idempotency_keys_return_existing_runs(api: Api, db_url: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("globex")) as globex:
        single = (await acme.post("/v1/runs", json={"input": {"i": 0}},
                                  headers={"Idempotency-Key": "k0"})).json()
        runs = [{"input": {"i": i}, "idempotency_key": f"k{i}"} for i in range(3)]
        submitted = metrics.RUNS_SUBMITTED.labels("default")._value.get()
        first = await batch(acme, runs)
        # The metric counts the runs made, not the items answered.
        assert metrics.RUNS_SUBMITTED.labels("default")._value.get() == submitted + 2
        assert first.status_code == 201
        assert first.json()["created"] == [False, True, True]
        assert first.json()["runs"][0]["id"] == single["id"]
        again = await batch(acme, runs)
        assert again.status_code == 200
        assert [r["id"] for r in again.json()["runs"]] == [r["id"] for r in first.json()["runs"]]
        # Keys are a tenant's own: the same keys make globex's own runs.
        theirs = await batch(globex, runs)
        assert theirs.status_code == 201
        assert not {r["id"] for r in theirs.json()["runs"]} & {
            r["id"] for r in first.json()["runs"]}
    assert count_runs(db_url) == 6


async def test_refused_items_are_named_by_index_and_nothing_is_written(
        api: Api, db_url: str, live_store: RunStore) -> None:
    await live_store.put_pool(Pool("banded"), {"acme": TenantLimit(None, -5, 5)})
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        await acme.post("/v1/runs", json={"input": {"old": True}},
                        headers={"Idempotency-Key": "taken"})
        r = await batch(acme, [
            {"input": {"ok": 1}},
            {"input": {}, "pool": "banded", "priority": 9},
            {"input": {}, "pool": "nowhere"},
            {"input": {"new": True}, "idempotency_key": "taken"},
            {"input": {"ok": 2}, "pool": "banded", "priority": 5},
        ])
    assert r.status_code == 422, r.text
    assert [(e["index"], e["code"]) for e in r.json()["errors"]] == [
        (1, "invalid_request"), (2, "unknown_pool"), (3, "idempotency_conflict")]
    assert r.json()["errors"][0]["field"] == "priority"
    assert count_runs(db_url) == 1


async def test_invalid_items_are_named_by_index(api: Api, db_url: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        r = await batch(acme, [{"input": {}}, {"input": {}, "labels": {"bad key": "v"}},
                               {"input": {}}, {"input": {}, "priority": 1000},
                               {"input": {}, "delay_s": 5, "run_at": "2030-01-01T00:00:00Z"}])
        assert r.status_code == 422, r.text
        assert [e["index"] for e in r.json()["errors"]] == [1, 3, 4]
        dup = await batch(acme, [{"input": {}, "idempotency_key": "d"},
                                 {"input": {}, "idempotency_key": "d"}])
        assert dup.status_code == 422
        assert [(e["index"], e["field"]) for e in dup.json()["errors"]] == [
            (1, "idempotency_key")]
        for body in ({"runs": []}, {"runs": [{"input": {}}] * 1001}, {"runs": {}}, {}):
            r = await acme.post("/v1/runs/batch", json=body)
            assert r.status_code == 422, (str(body)[:50], r.text)
        r = await acme.post("/v1/runs/batch", content=b'{"runs": [' + b" " * (17 << 20),
                            headers={"Content-Type": "application/json"})
        assert r.status_code == 413
    assert count_runs(db_url) == 0


async def test_tenant_rules_are_those_of_a_single_submit(api: Api, db_url: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as admin:
        # A 403 as for a single submit (the token may not do this with a well-formed body).
        r = await batch(acme, [{"input": {}}, {"input": {}, "tenant_id": "globex"}])
        assert (r.status_code, r.json()["error"]["field"]) == (403, "runs[1].tenant_id")
        r = await batch(admin, [{"input": {}, "tenant_id": "globex"}, {"input": {}}])
        assert (r.status_code, r.json()["error"]["field"]) == (403, "runs[1].tenant_id")
        r = await batch(admin, [{"input": {}, "tenant_id": "globex"},
                                {"input": {}, "tenant_id": "initech"}])
        assert r.status_code == 201
        assert [x["tenant_id"] for x in r.json()["runs"]] == ["globex", "initech"]
        assert r.json()["runs"][0]["lease"] is None
    assert count_runs(db_url) == 2


async def test_runs_for_later_wait_outside_the_claim(store: RunStore, clock: ManualClock,
                                                     db_url: str) -> None:
    later = await store.enqueue("default", "acme", {"when": "later"}, delay_s=600)
    at = await store.enqueue("default", "acme", {"when": "at"},
                             run_at=clock.db_now() + timedelta(seconds=1200))
    past = await store.enqueue("default", "acme", {"when": "past"},
                               run_at=clock.db_now() - timedelta(days=3))
    assert later.run.available_at == clock.db_now() + timedelta(seconds=600)
    assert past.run.available_at == clock.db_now()  # a past time means now
    with psycopg.connect(db_url) as conn:
        delayed = dict(conn.execute("SELECT id, delayed FROM agent_runs").fetchall())
    assert delayed == {later.run.id: True, at.run.id: True, past.run.id: False}
    assert [lease.run_id for lease in await store.claim("default", "w", 5)] == [past.run.id]
    # A worker for each time (one incarnation is never renewed here).
    clock.advance(601)
    assert [lease.run_id for lease in await store.claim("default", "w2", 5)] == [later.run.id]
    clock.advance(600)
    assert [lease.run_id for lease in await store.claim("default", "w3", 5)] == [at.run.id]


@pytest.mark.parametrize(("extra", "field"), [
    ({"delay_s": -1}, "delay_s"), ({"delay_s": 400 * 86400}, "delay_s"),
    ({"delay_s": "soon"}, "delay_s"), ({"run_at": "2026-01-01T00:00:00"}, "run_at"),
    ({"run_at": "tomorrow"}, "run_at"),
    ({"run_at": (datetime.now(UTC) + timedelta(days=400)).isoformat()}, "run_at"),
])
async def test_bad_start_times_are_422(api: Api, extra: dict[str, Any], field: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        r = await acme.post("/v1/runs", json={"input": {}, **extra})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field


async def test_both_start_times_are_refused(api: Api, store: RunStore) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        r = await acme.post("/v1/runs", json={"input": {}, "delay_s": 1,
                                              "run_at": "2030-01-01T00:00:00Z"})
    assert r.status_code == 422
    with pytest.raises(ValidationError, match="not both"):
        await store.enqueue("default", "acme", {}, delay_s=1, run_at=datetime.now(UTC))


async def test_store_batch_names_every_refused_item(store: RunStore) -> None:
    with pytest.raises(BatchRefused) as refused:
        await store.enqueue_many("default", [NewRun("acme", {}), NewRun("acme", {}, priority=500),
                                             NewRun("acme", {}, labels={"k": "\x00"})])
    assert [(e.index, e.field) for e in refused.value.errors] == [(1, "priority"),
                                                                  (2, "labels.k")]


async def test_sdk_submit_many_sync_and_async(api: Api) -> None:
    runs = [{"input": {"i": i}, "idempotency_key": f"many-{i}", "labels": {"suite": "s"}}
            for i in range(7)]
    sizes: list[int] = []
    async with AsyncClient(api.url, api.token("acme")) as client:
        made = await client.submit_many(runs, chunk=3, on_chunk=sizes.append)
        assert sizes == [3, 3, 1]
        assert [r.input["i"] for r in made] == list(range(7))
        assert all(r.created for r in made)
        delayed = await client.submit({"x": 1}, delay_s=60, labels={"suite": "s"})
        assert delayed.available_at > delayed.created_at

    def again() -> list[Any]:
        with Client(api.url, api.token("acme")) as client:
            return client.submit_many(runs)

    repeated = await asyncio.to_thread(again)
    assert [r.id for r in repeated] == [r.id for r in made]
    assert not any(r.created for r in repeated)


async def test_a_submit_wakes_the_pool_after_its_commit(api: Api, db_url: str) -> None:
    """The API enqueues without a NOTIFY in the transaction and wakes the pool
    after the commit (api/wakeups.py); a listener hears it, and finds the run."""
    conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    try:
        await conn.execute("LISTEN runlease_pool_default")
        async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
            for path, body in (("/v1/runs", {"input": {}}),
                               ("/v1/runs/batch", {"runs": [{"input": {}}, {"input": {}}]})):
                r = await acme.post(path, json=body)
                assert r.status_code == 201
                note = await asyncio.wait_for(anext(conn.notifies()), 10)
                assert note.payload == "default"
                got = await conn.execute("SELECT count(*) FROM agent_runs")
                assert (await got.fetchone()) in ((1,), (3,))
            # A run for later wakes nobody.
            r = await acme.post("/v1/runs", json={"input": {}, "delay_s": 600})
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(conn.notifies()), 1)
    finally:
        await conn.close()
