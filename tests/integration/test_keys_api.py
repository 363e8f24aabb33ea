"""Concurrency keys over HTTP (issue 27): a pool's key limits set by an
admin (API, SDK, CLI), runs submitted with a key held to them, and what a
hostile caller gets."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx

from runlease.client import AsyncClient
from tests.support.api import Api


async def test_key_limits_hold_runs_of_a_key_back(api: Api, db_url: str) -> None:
    async with AsyncClient(api.url, api.token("admin")) as admin, \
            AsyncClient(api.url, api.token("acme")) as acme:
        limits = await admin.set_key_limits("default", default=1, keys={"repo-main": 2})
        assert (limits["default"], limits["keys"]) == (1, {"repo-main": 2})
        runs = [await acme.submit({"i": i}, concurrency_key="user-1") for i in range(3)]
        assert {r.concurrency_key for r in runs} == {"user-1"}
        assert [r.available_at.year for r in runs[1:]] == [9999, 9999]  # parked
        listed = await admin.key_limits("default")
        assert listed["keys"] == {"repo-main": 2}
        raised = await admin.set_key_limits("default", default=3)
        assert raised["unparked"] == 2
        assert {(await acme.get(r.id)).available_at.year for r in runs} != {9999}


async def test_hostile_key_input_is_refused(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as admin, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        for body in ({"default": 0}, {"default": -1}, {"default": 10**9}, {"default": "2"},
                     {"keys": {"k": 0}}, {"keys": {"a b": 1}}, {"keys": {"x" * 129: 1}},
                     {"keys": {"*": 1}}, {"keys": {"k": 1.5}}, {"other": 1}):
            answer = await admin.put("/v1/pools/default/key-limits", json=body)
            assert answer.status_code == 422, (body, answer.text)
        assert (await admin.put("/v1/pools/nope/key-limits", json={})).status_code == 404
        assert (await acme.put("/v1/pools/default/key-limits",
                               json={"default": 1000})).status_code == 403
        assert (await acme.get("/v1/pools/default/key-limits")).status_code == 403
        for body in ({"concurrency_key": "x" * 129}, {"concurrency_key": ""},
                     {"concurrency_key": "a/b"}, {"concurrency_key": 3},
                     {"concurrency_key": "k", "thread_id": "t"}):
            answer = await acme.post("/v1/runs", json={"input": {}, **body})
            assert answer.status_code == 422, (body, answer.text)
        # In a batch (accepted since issue 27's rest), a hostile key is refused there too.
        batch = await acme.post("/v1/runs/batch",
                                json={"runs": [{"input": {}, "concurrency_key": "k"},
                                               {"input": {}, "concurrency_key": "a/b"}]})
        assert batch.status_code == 422
        assert (await acme.get("/v1/runs")).json()["items"] == []


async def test_the_cli_sets_key_limits_and_submits_with_a_key(api: Api) -> None:
    async def cli(who: str, *args: str) -> tuple[int, str, str]:
        env = {**os.environ, "RUNLEASE_API_URL": api.url, "RUNLEASE_TOKEN": api.token(who),
               "COLUMNS": "200"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runlease", *args, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(), err.decode()

    code, out, err = await cli("admin", "pools", "key-limits", "default", "--default", "2",
                               "--key", "repo=1", "--json")
    assert code == 0, err
    assert json.loads(out)["keys"] == {"repo": 1}
    code, out, err = await cli("admin", "pools", "key-limits", "default", "--key", "repo=none",
                               "--json")
    assert code == 0, err
    assert (json.loads(out)["default"], json.loads(out)["keys"]) == (2, {})
    code, out, err = await cli("acme", "runs", "submit", "--input", "{}", "--key", "u-1",
                               "--json")
    assert code == 0, err
    assert json.loads(out)["concurrency_key"] == "u-1"


async def test_keys_of_two_tenants_are_apart(api: Api) -> None:
    async with AsyncClient(api.url, api.token("admin")) as admin, \
            AsyncClient(api.url, api.token("acme")) as acme, \
            AsyncClient(api.url, api.token("globex")) as globex:
        await admin.set_key_limits("default", default=1)
        mine = await acme.submit({}, concurrency_key="shared")
        theirs = await globex.submit({}, concurrency_key="shared")
        # Each took its own tenant's slot: another tenant's "shared" holds none of it.
        assert {mine.available_at.year, theirs.available_at.year} != {9999}
        assert theirs.available_at.year != 9999
        parked = await globex.submit({}, concurrency_key="shared")
        assert parked.available_at.year == 9999
