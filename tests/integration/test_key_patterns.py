"""Key limits by pattern, and each key's waiting runs counted (issue 27's
rest, migration 0021): a pattern ("user-*") limits each key it matches; a
key's own limit beats the longest pattern it matches, which beats the
default; the parked runs of a key are counted as they park and unpark, and
the pool's top keys by waiting runs are what the gauge shows, bounded."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from runlease.client import AsyncClient
from runlease.db.keys import KeyLimits
from runlease.db.store import NewRun, RunStore
from runlease.errors import ValidationError
from runlease.operator.gauges import export
from runlease.operator.spec import parse
from runlease.operator.status import Observed
from tests.console.test_console_http import csrf_of, signed_in
from tests.integration.test_keys import claim_all, submit
from tests.operator.test_builders import FULL, MINIMAL
from tests.support.api import Api


async def _usage(store: RunStore, key: str, tenant: str = "t") -> tuple[int, int]:
    return await store.key_usage("default", tenant, key)


async def test_a_pattern_limits_each_key_it_matches(store: RunStore) -> None:
    await store.replace_key_limits("default", KeyLimits(default=4, keys={
        "user-*": 1, "user-vip-*": 3, "user-vip-7": 2, "a_b*": 1}))
    for key in ("user-1", "user-2", "user-vip-1", "user-vip-7", "repo-x", "a_b1", "axb1"):
        for i in range(5):
            await submit(store, "t", key, i=i)
    assert await _usage(store, "user-1") == (1, 4)  # the pattern, each key its own
    assert await _usage(store, "user-2") == (1, 4)
    assert await _usage(store, "user-vip-1") == (3, 2)  # the longest pattern
    assert await _usage(store, "user-vip-7") == (2, 3)  # its own beats every pattern
    assert await _usage(store, "repo-x") == (4, 1)  # no pattern: the default
    assert await _usage(store, "a_b1") == (1, 4)
    assert await _usage(store, "axb1") == (4, 1)  # `_` is itself, not LIKE's any character
    leased = await claim_all(store)
    assert len(leased) == 1 + 1 + 3 + 2 + 4 + 1 + 4


async def test_a_pattern_changed_hands_out_the_slots_it_frees(store: RunStore) -> None:
    await store.replace_key_limits("default", KeyLimits(keys={"user-*": 1}))
    for i in range(3):
        await submit(store, "t", "user-1", i=i)
    assert await _usage(store, "user-1") == (1, 2)
    moved = await store.replace_key_limits("default", KeyLimits(keys={"user-*": 3}))
    assert moved == 2
    assert await _usage(store, "user-1") == (3, 0)
    assert await store.key_limits("default") == KeyLimits(keys={"user-*": 3})


@pytest.mark.parametrize("name", ["*", "**", "a b*", "x*" * 65, "-x*", "a/*", "*\x00"])
async def test_hostile_patterns_are_refused(store: RunStore, name: str) -> None:
    with pytest.raises(ValidationError):
        await store.replace_key_limits("default", KeyLimits(keys={name: 1}))
    assert await store.key_limits("default") == KeyLimits()


async def test_a_run_cannot_name_a_pattern_as_its_key(store: RunStore) -> None:
    async with store.connection() as conn, conn.transaction():
        (result,) = await store.enqueue_many("default", [NewRun("t", {})], conn=conn)
        with pytest.raises(ValidationError):
            await store.join_key(result.run.id, "user-*", conn=conn)


async def test_waiting_runs_are_counted_as_they_park_and_unpark(store: RunStore) -> None:
    await store.replace_key_limits("default", KeyLimits(default=1))
    for i in range(5):
        await submit(store, "t", "k", i=i)

    async def agree(n: int) -> None:
        assert await _usage(store, "k") == (1, n)
        assert await store.key_waiting_counted("default", "t", "k") == n

    await agree(4)
    (lease,) = await store.claim("default", "w", 10)
    await store.ack(lease)  # its slot goes to the next
    await agree(3)
    parked = [r for r in await store.list_runs(limit=50)
              if r.available_at.year == 9999 and r.status == "pending"]
    await store.request_cancel(parked[0].id)  # a parked run cancelled: one less waits
    await agree(2)
    await store.replace_key_limits("default", KeyLimits(default=2))  # a raise unparks one
    assert await _usage(store, "k") == (2, 1)
    assert await store.key_waiting_counted("default", "t", "k") == 1


async def test_the_top_keys_by_waiting_runs_are_bounded(store: RunStore) -> None:
    await store.replace_key_limits("default", KeyLimits(default=1))
    for k in range(14):
        for i in range(k + 2):  # key k has k + 1 parked
            await submit(store, f"t{k % 3}", f"key-{k}", i=i)
    top = await store.keys_waiting("default")
    assert [(w.key, w.waiting, w.active) for w in top] == [
        (f"key-{k}", k + 1, 1) for k in range(13, 3, -1)]
    stats = await store.queue_stats("default")
    assert stats.keys_waiting == {(w.tenant_id, w.key): w.waiting for w in top}
    assert len(stats.keys_waiting) == 10
    # The gauge shows those 10 and drops a key that left the top.
    spec = parse("keys", "ml", FULL | {"pool": "default"})
    export(spec, Observed(1, 1, 1, 1, stats, 0))
    shown = [line for line in generate_latest().decode().splitlines()
             if line.startswith("runlease_key_waiting_runs{") and 'pool="default"' in line]
    assert len(shown) == 10
    assert 'runlease_key_waiting_runs{key="key-13",pool="default",tenant="t1"} 14.0' in shown
    await store.replace_key_limits("default", KeyLimits())  # every parked run unparked
    export(spec, Observed(1, 1, 1, 1, await store.queue_stats("default"), 0))
    assert not [line for line in generate_latest().decode().splitlines()
                if line.startswith("runlease_key_waiting_runs{") and 'pool="default"' in line]


async def test_patterns_over_http_and_in_the_spec(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as admin:
        ok = await admin.put("/v1/pools/default/key-limits",
                             json={"default": 5, "keys": {"user-*": 2, "user-vip-1": 4}})
        assert ok.status_code == 200, ok.text
        assert ok.json()["keys"] == {"user-*": 2, "user-vip-1": 4}
        bad: list[dict[str, Any]] = [{"keys": {"*": 1}}, {"keys": {"***": 1}},
                                     {"keys": {"us er*": 1}}, {"keys": {"x*" * 65: 1}}]
        for body in bad:
            answer = await admin.put("/v1/pools/default/key-limits", json=body)
            assert answer.status_code == 422, (body, answer.text)
    spec = MINIMAL | {"concurrencyKeys": {"limits": [{"key": "user-*", "maxInFlight": 2}]}}
    assert parse("batch", "ml", spec).key_limits == KeyLimits(None, {"user-*": 2})
    async with AsyncClient(api.url, api.token("admin")) as sdk:
        got = await sdk.set_key_limits("default", default=1, keys={"team-*": 4})
        assert got["keys"] == {"team-*": 4}
    env = {**os.environ, "RUNLEASE_API_URL": api.url, "RUNLEASE_TOKEN": api.token("admin")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlease", "pools", "key-limits", "default",
        "--key", "repo-*=3", "--json", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err
    assert json.loads(out)["keys"] == {"team-*": 4, "repo-*": 3}


async def test_the_console_shows_and_sets_key_limits(ui: Api, live_store: RunStore) -> None:
    async with signed_in(ui, "admin") as admin:
        page = await admin.get("/ui/pools")
        assert "Concurrency keys: unlimited per key" in page.text
        token = csrf_of(page.text)
        for key, limit in (("", "3"), ("user-*", "1"), ("repo-main", "2")):
            r = await admin.post("/ui/pools/default/key-limit",
                                 data={"csrf": token, "key": key, "max_in_flight": limit})
            assert r.status_code == 303, r.text
        assert await live_store.key_limits("default") == KeyLimits(3, {"user-*": 1,
                                                                       "repo-main": 2})
        r = await admin.post("/ui/pools/default/key-limit",
                             data={"csrf": token, "key": "repo-main", "max_in_flight": ""})
        assert r.status_code == 303
        for key, limit in (("*", "1"), ("a b", "1"), ("k", "-1"), ("k", "0"), ("x" * 200, "1")):
            bad = await admin.post("/ui/pools/default/key-limit",
                                   data={"csrf": token, "key": key, "max_in_flight": limit})
            assert bad.status_code == 400, (key, limit, bad.text)
        for i in range(3):
            await submit(live_store, "acme", "user-9", i=i)
        page = (await admin.get("/ui/pools")).text
        assert "Concurrency keys: 3 per key; <code>user-*</code> 1." in page
        assert "acme <code>user-9</code> 2" in page  # its waiting runs
    assert await live_store.key_limits("default") == KeyLimits(3, {"user-*": 1})
    async with signed_in(ui, "acme") as tenant:  # a tenant cannot set them
        r = await tenant.post("/ui/pools/default/key-limit",
                              data={"csrf": "x", "key": "", "max_in_flight": "9"})
        assert r.status_code in (303, 403)
    assert (await live_store.key_limits("default")).default == 3
