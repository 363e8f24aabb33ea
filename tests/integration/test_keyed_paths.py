"""Threads, concurrency keys, singletons and debounce on every path (issue
27, point 5): a batch's items and a schedule's ticks follow the rules of a
single submit, with idempotency keys, submit rates and a busy thread's
`reject` refusing the whole batch; two batches naming the same threads in
opposite orders never deadlock."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from runlease.clock import ManualClock
from runlease.core.cron import Cron
from runlease.db.keys import KeyLimits
from runlease.db.store import NewRun, RunStore
from runlease.errors import ValidationError
from tests.support.api import Api

START = datetime(2026, 12, 1, 10, 2, 0, tzinfo=UTC)
EVERY_5 = Cron.checked("*/5 * * * *")
PARKED = 9999


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


def _year(run: dict[str, Any]) -> int:
    return int(run["available_at"][:4])


async def _batch(http: httpx.AsyncClient, *items: dict[str, Any]) -> httpx.Response:
    return await http.post("/v1/runs/batch", json={"runs": list(items)})


async def test_a_batch_follows_each_items_thread_or_key(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as admin, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        assert (await admin.put("/v1/pools/default/key-limits",
                                json={"default": 1})).status_code == 200
        answer = await _batch(
            http,
            {"input": {"n": 0}, "thread_id": "c1"},
            {"input": {"n": 1}, "thread_id": "c1"},
            {"input": {"n": 2}, "concurrency_key": "u1"},
            {"input": {"n": 3}, "concurrency_key": "u1"},
            {"input": {"n": 4}, "singleton": {"key": "s1"}},
            {"input": {"n": 5}, "singleton": {"key": "s1"}},
            {"input": {"n": 6}, "debounce": {"key": "d1", "window_s": 60, "max_delay_s": 600}},
            {"input": {"n": 7}, "debounce": {"key": "d1", "window_s": 60, "max_delay_s": 600}},
            {"input": {"n": 8}})
        assert answer.status_code == 201, answer.text
        runs, created = answer.json()["runs"], answer.json()["created"]
        assert created == [True, True, True, True, True, False, True, False, True]
        # The thread: the first is its head, the second parked behind it.
        assert (_year(runs[0]) != PARKED, _year(runs[1])) == (True, PARKED)
        order = (await http.get("/v1/threads/c1/runs")).json()["items"]
        assert [r["id"] for r in order] == [runs[0]["id"], runs[1]["id"]]
        # The key at its limit of 1: the second parked.
        assert (_year(runs[2]) != PARKED, _year(runs[3])) == (True, PARKED)
        # The singleton answered its pending run; the debounce took the last input.
        assert runs[5]["id"] == runs[4]["id"]
        assert runs[7]["id"] == runs[6]["id"]
        assert (await http.get(f"/v1/runs/{runs[6]['id']}")).json()["input"] == {"n": 7}
        listed = (await http.get("/v1/runs", params={"limit": 50})).json()["items"]
        assert len(listed) == 7


async def test_a_busy_threads_reject_refuses_the_whole_batch(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        head = (await http.post("/v1/runs", json={"input": {}, "thread_id": "c"})).json()
        answer = await _batch(http, {"input": {}}, {"input": {}, "thread_id": "free"},
                              {"input": {}, "thread_id": "c", "multitask": "reject"})
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"]["code"] == "thread_busy"
        assert answer.json()["error"]["field"] == "runs[2].thread_id"
        assert head["id"] in answer.json()["error"]["message"]
        listed = (await http.get("/v1/runs")).json()["items"]
        assert [r["id"] for r in listed] == [head["id"]]  # nothing of the batch
        assert (await http.get("/v1/threads/free")).status_code == 404


async def test_a_batch_repeat_by_idempotency_key_changes_nothing(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        items = [{"input": {"i": i}, "thread_id": "c", "idempotency_key": f"k{i}"}
                 for i in range(3)]
        first = await _batch(http, *items)
        again = await _batch(http, *items)
        assert (first.status_code, again.status_code) == (201, 200)
        assert [r["id"] for r in again.json()["runs"]] == [r["id"] for r in first.json()["runs"]]
        thread = (await http.get("/v1/threads/c")).json()
        assert thread["runs"] == 3
        # The same key with another input: refused as a plain batch's is, naming the item.
        clash = await _batch(http, {"input": {}, "thread_id": "c"},
                             {"input": {"other": 1}, "thread_id": "c", "idempotency_key": "k1"})
        assert clash.status_code == 422
        assert clash.json()["errors"][0]["index"] == 1
        assert clash.json()["errors"][0]["code"] == "idempotency_conflict"
        assert (await http.get("/v1/threads/c")).json()["runs"] == 3


async def test_a_batch_of_keyed_runs_counts_against_the_submit_rate(api: Api,
                                                                    store: RunStore) -> None:
    await store.set_tenant_rates("default", "acme", 3, None)
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        over = await _batch(http, *({"input": {}, "thread_id": f"c{i}"} for i in range(4)))
        assert over.status_code == 429
        assert "Retry-After" in over.headers
        assert (await http.get("/v1/runs")).json()["items"] == []
        fits = await _batch(http, *({"input": {}, "concurrency_key": "u"} for _ in range(3)))
        assert fits.status_code == 201


async def test_a_batch_item_interrupts_its_threads_head(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        head = (await http.post("/v1/runs", json={"input": {}, "thread_id": "c"})).json()
        answer = await _batch(http, {"input": {}, "thread_id": "c", "multitask": "rollback"})
        assert answer.status_code == 201
        (new,) = answer.json()["runs"]
        old = (await http.get(f"/v1/runs/{head['id']}")).json()
        assert (old["status"], old["rolled_back"]) == ("cancelled", True)
        thread = (await http.get("/v1/threads/c")).json()
        assert thread["head_run_id"] == new["id"]


async def test_batches_naming_threads_in_opposite_orders_never_deadlock(api: Api) -> None:
    names = [f"c{i}" for i in range(6)]
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme"),
                                 timeout=30) as http:
        answers = await asyncio.gather(*(
            _batch(http, *({"input": {"b": b}, "thread_id": t, "concurrency_key": None}
                           for t in (names if b % 2 else names[::-1])),
                   *({"input": {"b": b}, "concurrency_key": k} for k in
                     (["k1", "k2"] if b % 2 else ["k2", "k1"])))
            for b in range(8)))
        assert [a.status_code for a in answers] == [201] * 8, [a.text for a in answers]
        for t in names:
            assert (await http.get(f"/v1/threads/{t}")).json()["runs"] == 8


async def test_a_batch_items_bad_key_is_named(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        for item, field in (({"input": {}, "thread_id": "a b"}, "thread_id"),
                            ({"input": {}, "concurrency_key": "x" * 129}, "concurrency_key"),
                            ({"input": {}, "thread_id": "c", "concurrency_key": "k"}, None),
                            ({"input": {}, "multitask": "reject"}, None)):
            answer = await _batch(http, {"input": {}}, item)
            assert answer.status_code == 422, (item, answer.text)
            if field is not None:
                assert answer.json()["errors"][0]["field"] == field
        assert (await http.get("/v1/runs")).json()["items"] == []


async def _tick(store: RunStore, clock: ManualClock, minute: int) -> list[Any]:
    clock.advance((START.replace(minute=minute) - clock.db_now()).total_seconds())
    return await store.fire_due_schedules()


async def test_a_schedules_ticks_go_into_its_thread_in_order(store: RunStore,
                                                             clock: ManualClock) -> None:
    await store.create_schedule("acme", "digest", EVERY_5,
                                {"input": {}, "thread_id": "daily-digest"}, overlap="allow")
    ids = [(await _tick(store, clock, m))[0].run_id for m in (5, 10, 15)]
    thread = await store.get_thread("acme", "daily-digest")
    assert thread is not None
    assert (thread.head_run_id, thread.runs) == (ids[0], 3)
    runs = await store.thread_runs("acme", "daily-digest")
    assert [r.id for r in runs] == ids
    assert [r.available_at.year == PARKED for r in runs] == [False, True, True]


async def test_a_schedules_singleton_skips_while_its_run_is_open(store: RunStore,
                                                                 clock: ManualClock) -> None:
    await store.create_schedule("acme", "sync", EVERY_5,
                                {"input": {}, "singleton": {"key": "sync"}}, overlap="allow")
    (first,) = await _tick(store, clock, 5)
    (second,) = await _tick(store, clock, 10)
    assert first.run_id is not None
    assert second.run_id == first.run_id  # answered with the open run
    await store.request_cancel(first.run_id)
    (third,) = await _tick(store, clock, 15)
    assert third.run_id not in (None, first.run_id)


async def test_a_schedules_key_is_held_to_its_limit(store: RunStore,
                                                    clock: ManualClock) -> None:
    await store.replace_key_limits("default", KeyLimits(keys={"repo-main": 1}))
    await store.create_schedule("acme", "ci", EVERY_5,
                                {"input": {}, "concurrency_key": "repo-main"}, overlap="allow")
    first = (await _tick(store, clock, 5))[0].run_id
    second = (await _tick(store, clock, 10))[0].run_id
    assert first is not None
    assert second is not None
    assert (await store.get(second)).available_at.year == PARKED
    assert await store.key_usage("default", "acme", "repo-main") == (1, 1)


async def test_a_schedules_reject_on_a_busy_thread_skips_the_tick(
    store: RunStore, clock: ManualClock
) -> None:
    async with store.connection() as conn, conn.transaction():
        busy = await store.submit_to_thread("default", NewRun("acme", {}), "c", conn=conn)
    schedule = await store.create_schedule(
        "acme", "poke", EVERY_5, {"input": {}, "thread_id": "c", "multitask": "reject"})
    (tick,) = await _tick(store, clock, 5)
    assert tick.run_id is None
    assert tick.error is not None
    assert str(busy.result.run.id) in tick.error
    assert (await store.get_schedule(schedule.id)).last_error == tick.error


async def test_a_schedules_interrupt_cancels_the_threads_head(store: RunStore,
                                                              clock: ManualClock) -> None:
    async with store.connection() as conn, conn.transaction():
        old = await store.submit_to_thread("default", NewRun("acme", {}), "c", conn=conn)
    await store.create_schedule("acme", "fresh", EVERY_5,
                                {"input": {}, "thread_id": "c", "multitask": "interrupt"})
    (tick,) = await _tick(store, clock, 5)
    assert (await store.get(old.result.run.id)).status == "cancelled"
    thread = await store.get_thread("acme", "c")
    assert thread is not None
    assert thread.head_run_id == tick.run_id


@pytest.mark.parametrize("template", [
    {"input": {}, "thread_id": "c", "concurrency_key": "k"},
    {"input": {}, "multitask": "reject"},
    {"input": {}, "thread_id": "a b"},
    {"input": {}, "debounce": {"key": "d", "window_s": 10, "max_delay_s": 5}},
    {"input": {}, "singleton": {"key": "s", "on_conflict": "other"}},
], ids=["two", "multitask_alone", "odd_thread", "short_max_delay", "odd_policy"])
async def test_a_bad_keyed_template_is_refused_at_create(store: RunStore,
                                                         template: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        await store.create_schedule("acme", "bad", EVERY_5, template)


async def test_schedules_take_keyed_templates_over_http(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        made = await http.post("/v1/schedules", json={
            "name": "digest", "cron": "0 8 * * *",
            "template": {"input": {}, "thread_id": "digest", "multitask": "enqueue"}})
        assert made.status_code == 201, made.text
        assert made.json()["template"]["thread_id"] == "digest"
        for template in ({"input": {}, "multitask": "reject"},
                         {"input": {}, "thread_id": "c", "singleton": {"key": "s"}},
                         {"input": {}, "concurrency_key": "\x00"}):
            bad = await http.post("/v1/schedules", json={"name": "bad", "cron": "0 8 * * *",
                                                          "template": template})
            assert bad.status_code == 422, (template, bad.text)


async def test_concurrent_singleton_submits_leave_one_run_either_way(api: Api) -> None:
    """12 submits of one key at once over HTTP: with skip, one run answers
    all; with cancel_in_progress, each new run cancels the one before it and
    exactly one is left (never two where one is promised)."""
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme"),
                                 timeout=30) as http:
        skip = await asyncio.gather(*(
            http.post("/v1/runs", json={"input": {"i": i}, "singleton": {"key": "s"}})
            for i in range(12)))
        assert sorted(a.status_code for a in skip) == [200] * 11 + [201]
        assert len({a.json()["id"] for a in skip}) == 1
        cancel = await asyncio.gather(*(
            http.post("/v1/runs", json={"input": {"i": i}, "singleton": {
                "key": "c", "on_conflict": "cancel_in_progress"}})
            for i in range(12)))
        assert [a.status_code for a in cancel] == [201] * 12
        states = [(await http.get(f"/v1/runs/{a.json()['id']}")).json()["status"]
                  for a in cancel]
        assert sorted(states) == ["cancelled"] * 11 + ["pending"]


async def test_a_tenant_flooding_one_thread_is_held_to_its_rate(
    api: Api, store: RunStore, clock: ManualClock
) -> None:
    """40 submits into one thread at once by a tenant with a rate of 20 a
    minute: exactly 20 taken, the rest 429 (never a 500); another tenant's
    thread of the same name is its own, and its run is claimed beside the
    flood's one active run. (The queue quota bounds a flood too, but only
    roughly under concurrent submits: docs/limits.md.)"""
    await store.set_tenant_rates("default", "acme", 20, None)
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme"),
                                 timeout=30) as acme, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("globex")) as globex:
        flood = await asyncio.gather(*(
            acme.post("/v1/runs", json={"input": {"i": i}, "thread_id": "c"})
            for i in range(40)))
        codes = sorted(a.status_code for a in flood)
        assert codes.count(201) == 20
        assert set(codes) == {201, 429}
        assert {a.json()["error"]["code"] for a in flood if a.status_code == 429} == {
            "rate_limited"}
        thread = (await acme.get("/v1/threads/c")).json()
        assert thread["runs"] == 20
        theirs = (await globex.post("/v1/runs", json={"input": {}, "thread_id": "c"})).json()
    clock.advance((datetime.now(UTC) - clock.db_now()).total_seconds() + 1)  # the API's time
    leases = await store.claim("default", "w", 10)
    assert {le.run.tenant_id for le in leases} == {"acme", "globex"}
    assert sum(le.run.tenant_id == "acme" for le in leases) == 1  # one at a time
    assert theirs["id"] in {str(le.run.id) for le in leases}


async def _cli(api: Api, *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    env = {**os.environ, "RUNLEASE_API_URL": api.url, "RUNLEASE_TOKEN": api.token("acme"),
           "COLUMNS": "200"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlease", *args, env=env, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate(stdin)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_the_cli_makes_keyed_schedules_and_batches(api: Api) -> None:
    code, out, err = await _cli(api, "schedules", "create", "digest", "--cron", "0 8 * * *",
                                "--input", "{}", "--thread", "digest", "--multitask",
                                "interrupt", "--json")
    assert code == 0, err
    template = json.loads(out)["template"]
    assert (template["thread_id"], template["multitask"]) == ("digest", "interrupt")
    code, out, err = await _cli(api, "schedules", "create", "sync", "--cron", "0 8 * * *",
                                "--input", "{}", "--singleton", "crm:cancel_in_progress",
                                "--json")
    assert code == 0, err
    assert json.loads(out)["template"]["singleton"] == {"key": "crm",
                                                        "on_conflict": "cancel_in_progress"}
    code, out, err = await _cli(api, "schedules", "create", "bad", "--cron", "0 8 * * *",
                                "--input", "{}", "--thread", "t", "--key", "k")
    assert code != 0
    lines = "".join(json.dumps({"input": {"i": i}, "thread_id": "bulk"}) + "\n"
                    for i in range(3)).encode()
    code, out, err = await _cli(api, "runs", "submit", "--file", "-", stdin=lines)
    assert code == 0, err
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        assert (await http.get("/v1/threads/bulk")).json()["runs"] == 3


async def test_a_thousand_item_batch_into_one_thread_keeps_its_order(api: Api) -> None:
    """A flood of one thread by batch: the largest batch, every item into one
    thread, is taken (no 500), numbered in the order given, one run active."""
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme"),
                                 timeout=120) as http:
        answer = await _batch(http, *({"input": {"i": i}, "thread_id": "flood"}
                                      for i in range(1000)))
        assert answer.status_code == 201, answer.text[:300]
        ids = [r["id"] for r in answer.json()["runs"]]
        assert sum(_year(r) != PARKED for r in answer.json()["runs"]) == 1
        page = (await http.get("/v1/threads/flood/runs", params={"limit": 500})).json()
        assert [r["id"] for r in page["items"]] == ids[:500]
        thread = (await http.get("/v1/threads/flood")).json()
        assert (thread["runs"], thread["head_run_id"]) == (1000, ids[0])
