"""Singletons and debounce (issue 27): a submit answered with its key's
existing run; concurrent submits of one key never make two runs where one
is promised; hostile keys and windows refused."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable

import httpx
import pytest

from runlease.client import AsyncClient
from runlease.clock import ManualClock
from runlease.db.models import EnqueueResult
from runlease.db.singletons import Debounce
from runlease.db.store import NewRun, RunStore
from runlease.errors import ValidationError
from tests.support.api import Api


async def singleton(store: RunStore, key: str, policy: str = "skip",
                    **input_: object) -> EnqueueResult:
    async with store.connection() as conn, conn.transaction():
        out = await store.submit_singleton("default", NewRun("t", dict(input_)), key, policy,
                                           conn=conn)
    if out.interrupt is not None:
        await store.request_cancel(out.interrupt)
    return out.result


async def debounced(store: RunStore, key: str, window_s: float = 10, max_delay_s: float = 30,
                    **input_: object) -> EnqueueResult:
    async with store.connection() as conn, conn.transaction():
        return await store.submit_debounced("default", NewRun("t", dict(input_)),
                                            Debounce(key, window_s, max_delay_s), conn=conn)


async def test_singleton_skip_answers_the_pending_or_active_run(store: RunStore) -> None:
    first = await singleton(store, "sync", n=1)
    again = await singleton(store, "sync", n=2)
    assert (again.inserted, again.run.id) == (False, first.run.id)
    (lease,) = await store.claim("default", "w", 5)
    assert (await singleton(store, "sync")).run.id == first.run.id  # active: still it
    await store.ack(lease)
    after = await singleton(store, "sync")
    assert after.inserted  # finished: a new run


async def test_singleton_cancel_in_progress_cancels_and_starts_the_new(store: RunStore) -> None:
    first = await singleton(store, "sync")
    (held,) = await store.claim("default", "w", 5)
    second = await singleton(store, "sync", "cancel_in_progress")
    assert second.inserted
    assert (await store.get(first.run.id)).cancel_requested_at is not None
    (lease,) = await store.claim("default", "w", 5)
    assert lease.run.id == second.run.id
    third = await singleton(store, "sync", "cancel_in_progress")  # a pending one: at once
    assert (await store.get(second.run.id)).cancel_requested_at is not None
    assert third.inserted
    del held


async def test_debounce_replaces_the_input_and_pushes_the_start(
    store: RunStore, clock: ManualClock
) -> None:
    first = await debounced(store, "typing", msg="h")
    clock.advance(5)
    second = await debounced(store, "typing", msg="hello")
    assert (second.inserted, second.run.id) == (False, first.run.id)
    assert second.run.input_json == {"msg": "hello"}
    assert second.run.available_at > first.run.available_at  # pushed
    clock.advance(9)
    assert await store.claim("default", "w", 5) == []  # 9 s after the last: not yet
    for _ in range(3):  # keep typing: the start never passes 30 s after the first
        clock.advance(5)
        assert not (await debounced(store, "typing", msg="more")).inserted
    run = await store.get(first.run.id)
    assert (run.available_at - first.run.created_at).total_seconds() == 30  # capped
    clock.advance(30)
    (lease,) = await store.claim("default", "w2", 5)
    assert lease.run.id == first.run.id
    assert lease.run.input_json == {"msg": "more"}
    after = await debounced(store, "typing", msg="next")  # claimed: a new run
    assert after.inserted


async def test_concurrent_submits_of_one_key_make_one_run(store: RunStore) -> None:
    async def many(submit: Callable[[int], Awaitable[EnqueueResult]]) -> set[object]:
        results = await asyncio.gather(*(submit(i) for i in range(12)))
        return {r.run.id for r in results}

    assert len(await many(lambda i: singleton(store, "k", i=i))) == 1
    assert len(await many(lambda i: debounced(store, "d", i=i))) == 1


@pytest.mark.parametrize("bad", [
    Debounce("", 1, 2), Debounce("a b", 1, 2), Debounce("x" * 129, 1, 2), Debounce("k", 0, 2),
    Debounce("k", -1, 2), Debounce("k", 5, 2), Debounce("k", 1, 10**9), Debounce("k", True, 2),
])
async def test_hostile_debounces_are_refused(store: RunStore, bad: Debounce) -> None:
    async with store.connection() as conn, conn.transaction():
        with pytest.raises(ValidationError):
            await store.submit_debounced("default", NewRun("t", {}), bad, conn=conn)


async def test_singleton_and_debounce_over_http(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        one = await http.post("/v1/runs", json={"input": {}, "singleton": {"key": "s"}})
        two = await http.post("/v1/runs", json={"input": {}, "singleton": {"key": "s"}})
        assert (one.status_code, two.status_code) == (201, 200)
        assert one.json()["id"] == two.json()["id"]
        d1 = await http.post("/v1/runs", json={"input": {"v": 1}, "debounce": {
            "key": "d", "window_s": 30, "max_delay_s": 60}})
        d2 = await http.post("/v1/runs", json={"input": {"v": 2}, "debounce": {
            "key": "d", "window_s": 30, "max_delay_s": 60}})
        assert (d1.status_code, d2.status_code) == (201, 200)
        assert d2.json()["id"] == d1.json()["id"]
        assert d2.json()["input"] == {"v": 2}
        for body in ({"singleton": {"key": "a b"}}, {"singleton": {"key": "s", "on_conflict": "x"}},
                     {"debounce": {"key": "d", "window_s": 10, "max_delay_s": 5}},
                     {"debounce": {"key": "d", "window_s": 0, "max_delay_s": 5}},
                     {"debounce": {"key": "d", "window_s": 1, "max_delay_s": 5}, "delay_s": 3},
                     {"singleton": {"key": "s"}, "thread_id": "t"},
                     {"singleton": {"key": "s"}, "debounce": {"key": "d", "window_s": 1,
                                                              "max_delay_s": 5}}):
            answer = await http.post("/v1/runs", json={"input": {}, **body})
            assert answer.status_code == 422, (body, answer.text)
        # In a batch, as alone: the key's pending run answers (test_keyed_paths.py).
        batch = await http.post("/v1/runs/batch",
                                json={"runs": [{"input": {}, "singleton": {"key": "s"}}]})
        assert batch.status_code == 200
        assert batch.json()["runs"][0]["id"] == one.json()["id"]
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("globex")) as other:
        theirs = await other.post("/v1/runs", json={"input": {}, "singleton": {"key": "s"}})
        assert theirs.status_code == 201  # another tenant's key is its own
        assert theirs.json()["id"] != one.json()["id"]


async def test_the_sdk_and_cli_submit_singletons_and_debounces(api: Api) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client:
        one = await client.submit({}, singleton={"key": "nightly"})
        two = await client.submit({}, singleton={"key": "nightly"})
        assert (two.id, two.created) == (one.id, False)
    env = {**os.environ, "RUNLEASE_API_URL": api.url, "RUNLEASE_TOKEN": api.token("acme")}
    outs = []
    for _ in range(2):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runlease", "runs", "submit", "--input", "{}",
            "--debounce", "typing:30:60", "--json", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, err
        outs.append(json.loads(out)["id"])
    assert outs[0] == outs[1]
