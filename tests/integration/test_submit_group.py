"""Group commit of single submits (api/submit_group.py): submits made together
share one transaction and one INSERT, and each still gets the answer it
would have got alone: a refused one (rate, idempotency conflict, band,
unknown pool, bad input) fails alone, the rate stays exact."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import psycopg
import pytest

from runlease.api.errors import ErrorAnswer
from runlease.api.submit_group import SubmitGroups
from runlease.db.models import EnqueueResult, Pool, TenantLimit
from runlease.db.runs import NewRun
from runlease.db.store import RunStore
from runlease.errors import IdempotencyConflict, UnknownPool, ValidationError
from tests.support.api import Api


def run(tenant: str, i: Any, *, key: str | None = None, pool: str = "default",
        priority: int = 0) -> NewRun:
    return NewRun(tenant, {"i": i}, priority, idempotency_key=key, pool=pool)


def count(db_url: str, where: str = "true") -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(f"SELECT count(*) FROM agent_runs WHERE {where}").fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])


async def together(groups: SubmitGroups, runs: list[NewRun]) -> list[Any]:
    return await asyncio.gather(*(groups.submit(r) for r in runs), return_exceptions=True)


async def test_refused_submits_fail_alone_in_one_group(live_store: RunStore,
                                                       db_url: str) -> None:
    store = live_store
    await store.put_pool(Pool("banded"), {"acme": TenantLimit(None, -5, 5)})
    first = await store.enqueue("default", "acme", {"i": "old"}, idempotency_key="taken")
    groups = SubmitGroups(store)
    answers = await together(groups, [
        run("acme", 0),
        run("acme", "new", key="taken"),  # the key names another input's run
        run("acme", "old", key="taken"),  # the same input again: that run
        run("acme", 3, pool="banded", priority=9),  # outside the tenant's band
        run("acme", 4, pool="nope"),  # no such pool
        NewRun("acme", {"i": 5, "x": float("nan")}, pool="default"),  # not JSON
        run("globex", 6, key="taken"),  # keys are a tenant's own
        run("acme", 7, pool="banded", priority=5),
    ])
    # The replay shares its key with the conflict: it waits for the next group.
    assert (groups.groups, groups.largest) == (2, 7)
    ok = [a for a in answers if isinstance(a, EnqueueResult)]
    assert [a.run.input_json["i"] for a in ok] == [0, "old", 6, 7]
    assert [a.inserted for a in ok] == [True, False, True, True]
    assert ok[1].run.id == first.run.id
    assert isinstance(answers[1], IdempotencyConflict)
    assert isinstance(answers[3], ValidationError)
    assert answers[3].field == "priority"
    assert isinstance(answers[4], UnknownPool)
    assert isinstance(answers[5], ValidationError)
    assert answers[5].field == "input"
    assert count(db_url) == 4  # the old run and the three new ones


async def test_two_submits_with_one_key_never_share_a_group(live_store: RunStore,
                                                            db_url: str) -> None:
    groups = SubmitGroups(live_store)
    same, other = await together(groups, [run("acme", 1, key="k"), run("acme", 1, key="k")])
    assert isinstance(same, EnqueueResult)
    assert isinstance(other, EnqueueResult)
    assert same.run.id == other.run.id
    assert (same.inserted, other.inserted) == (True, False)
    assert groups.groups == 2
    conflict = await together(groups, [run("acme", 2, key="j"), run("acme", 3, key="j")])
    assert isinstance(conflict[0], EnqueueResult)
    assert isinstance(conflict[1], IdempotencyConflict)
    assert count(db_url) == 2


async def test_the_rate_is_exact_within_a_group(live_store: RunStore, db_url: str) -> None:
    store = live_store
    await store.put_pool(Pool("default"), {"acme": TenantLimit(submits_per_minute=4)})
    await store.enqueue("default", "acme", {"i": "old"}, idempotency_key="taken")
    groups = SubmitGroups(store)
    # One run of the minute is made: room for 3. The conflicting submit is
    # admitted first and writes nothing, so its place goes to the next, as
    # it would one submit after the other; globex is not rated.
    answers = await together(groups, [
        run("acme", "new", key="taken"), run("acme", "a"), run("acme", "b"),
        run("globex", "g"), run("acme", "c"), run("acme", "d"), run("acme", "e")])
    assert groups.groups == 1
    assert isinstance(answers[0], IdempotencyConflict)
    assert [a.run.input_json["i"] for a in answers[1:5]] == ["a", "b", "g", "c"]
    for refused in answers[5:]:
        assert isinstance(refused, ErrorAnswer)
        assert (refused.status, refused.code) == (429, "rate_limited")
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert count(db_url, "tenant_id = 'acme'") == 4
    # Full: the next group refuses every acme submit and makes globex's.
    again = await together(groups, [run("acme", "f"), run("globex", "h")])
    assert isinstance(again[0], ErrorAnswer)
    assert isinstance(again[1], EnqueueResult)


async def test_groups_in_flight_are_bounded_and_the_rest_wait(live_store: RunStore,
                                                              db_url: str) -> None:
    groups = SubmitGroups(live_store, max_group=5, max_in_flight=1)
    answers = await together(groups, [run("acme", i) for i in range(12)])
    assert all(isinstance(a, EnqueueResult) and a.inserted for a in answers)
    assert [a.run.input_json["i"] for a in answers] == list(range(12))
    assert (groups.groups, groups.largest) == (3, 5)
    assert count(db_url) == 12
    await groups.close()


@pytest.mark.parametrize("n", [24])
async def test_concurrent_http_submits_each_get_their_answer(api: Api, db_url: str,
                                                             n: int) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        taken = (await acme.post("/v1/runs", json={"input": {"i": "old"}},
                                 headers={"Idempotency-Key": "taken"})).json()
        answers = await asyncio.gather(
            *(acme.post("/v1/runs", json={"input": {"i": i}}) for i in range(n)),
            acme.post("/v1/runs", json={"input": {"i": "new"}},
                      headers={"Idempotency-Key": "taken"}),
            acme.post("/v1/runs", json={"input": {"i": "old"}},
                      headers={"Idempotency-Key": "taken"}),
            acme.post("/v1/runs", json={"input": {}, "pool": "nope"}))
    made, conflict, replay, unknown = answers[:n], *answers[n:]
    assert [a.status_code for a in made] == [201] * n
    assert sorted(a.json()["input"]["i"] for a in made) == list(range(n))
    assert all(a.headers["Location"] == f"/v1/runs/{a.json()['id']}" for a in made)
    assert (conflict.status_code, conflict.json()["error"]["code"]) == (
        409, "idempotency_conflict")
    assert (replay.status_code, replay.json()["id"]) == (200, taken["id"])
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "unknown_pool")
    assert count(db_url) == n + 1
    groups = api.server.app_state.opened().groups
    assert groups is not None
    assert groups.largest > 1  # they did share groups
