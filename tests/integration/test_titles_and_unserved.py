"""A run's title (issue 29): given at submit through the API, the SDK and the
CLI, bounded, redacted, shown back; and a pool whose runs could be claimed
while no live worker serves it, flagged by GET /v1/pools and `runlease
pools list`."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx
import psycopg

from runlease.client import AsyncClient
from runlease.core.redact import MASK
from runlease.db.workers import Registration
from tests.support.api import Api
from tests.support.databases import RegisteringStore


async def cli(api: Api, *args: str, who: str = "acme") -> tuple[int, str, str]:
    env = {**os.environ, "RUNLEASE_API_URL": api.url, "RUNLEASE_TOKEN": api.token(who),
           "COLUMNS": "200"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlease", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_title_through_the_api_the_sdk_and_the_cli(api: Api, db_url: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        r = await http.post("/v1/runs", json={"input": {"q": 1}, "title": "Nightly eval: search"})
        assert r.status_code == 201, r.text
        assert r.json()["title"] == "Nightly eval: search"
        got = (await http.get(f"/v1/runs/{r.json()['id']}")).json()
        assert got["title"] == "Nightly eval: search"
        listed = (await http.get("/v1/runs")).json()["items"]
        assert [x["title"] for x in listed] == ["Nightly eval: search"]
        untitled = (await http.post("/v1/runs", json={"input": {"q": 2}})).json()
        assert untitled["title"] is None
        # A batch carries titles too, and answers with them as GET does.
        batch = await http.post("/v1/runs/batch", json={"runs": [
            {"input": {"q": 3}, "title": "first of a batch \u00e9"}, {"input": {"q": 4}}]})
        assert batch.status_code == 201, batch.text
        runs = batch.json()["runs"]
        assert [x["title"] for x in runs] == ["first of a batch \u00e9", None]
        again = (await http.get(f"/v1/runs/{runs[0]['id']}")).json()
        assert again == runs[0] | {"last_event_seq": again["last_event_seq"]}
    async with AsyncClient(api.url, api.token("acme")) as sdk:
        run = await sdk.submit({"q": 5}, title="from the SDK")
        assert run.title == "from the SDK"
        assert (await sdk.get(run.id)).title == "from the SDK"
    code, out, err = await cli(api, "runs", "submit", "--input", '{"q": 6}', "--title",
                               "from the CLI", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["title"] == "from the CLI"
    code, out, err = await cli(api, "runs", "list", "-o", "wide")
    assert code == 0, err
    assert out.splitlines()[0].split()[-2:] == ["TITLE", "CREATED"]
    assert any(" from the CLI " in line for line in out.splitlines())
    with psycopg.connect(db_url) as conn:
        titles = {t for (t,) in conn.execute("SELECT title FROM agent_runs")}
    assert titles == {"Nightly eval: search", None, "first of a batch \u00e9", "from the SDK",
                      "from the CLI"}


async def test_a_hostile_title_is_refused_or_redacted(api: Api, db_url: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        for bad in ("x" * 201, "", "two\nlines", "tab\there", "nul\u0000", 42, ["a"]):
            r = await http.post("/v1/runs", json={"input": {}, "title": bad})
            assert r.status_code == 422, (bad, r.text)
            assert "title" in r.text
        huge = await http.post("/v1/runs", json={"input": {}, "title": "y" * 100_000})
        assert huge.status_code == 422
        batch = await http.post("/v1/runs/batch", json={"runs": [
            {"input": {}, "title": "ok"}, {"input": {}, "title": "z" * 201}]})
        assert batch.status_code == 422
        # A lone surrogate (JSON allows its escape): refused, never a 500.
        r = await http.post("/v1/runs", content=b'{"input": {}, "title": "a\\ud800b"}',
                            headers={"Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        secret = "deploy with password=hunter2hunter2 and Bearer abcdefghijklmnop12345"
        r = await http.post("/v1/runs", json={"input": {}, "title": secret})
        assert r.status_code == 201, r.text
        shown = r.json()["title"]
        assert "hunter2" not in shown
        assert "abcdefghijklmnop12345" not in shown
        assert MASK in shown
        # A title whose redaction grows past the bound is cut, still redacted.
        long_secret = "token=ab " * 22
        r = await http.post("/v1/runs", json={"input": {}, "title": long_secret[:199]})
        assert r.status_code == 201, r.text
        assert len(r.json()["title"]) <= 200
        assert "token=ab" not in r.json()["title"]
    with psycopg.connect(db_url) as conn:
        stored = [t for (t,) in conn.execute(
            "SELECT title FROM agent_runs WHERE title IS NOT NULL")]
    assert len(stored) == 2
    assert not any("hunter2" in t or "token=ab" in t for t in stored)


async def test_a_pool_with_ready_runs_and_no_live_worker_is_flagged(
        api: Api, live_store: RegisteringStore) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        assert (await http.put("/v1/pools/batch", json={})).status_code == 200

        async def pools() -> dict[str, dict[str, object]]:
            r = await http.get("/v1/pools")
            assert r.status_code == 200, r.text
            return {p["name"]: p["service"] for p in r.json()}

        # Empty pools: nothing waits, nothing to flag.
        seen = await pools()
        assert (seen["default"]["unserved"], seen["default"]["claimable"],
                seen["default"]["live_workers"]) == (False, False, 0)
        r = await http.post("/v1/runs", json={"input": {}, "tenant_id": "acme", "pool": "batch"})
        assert r.status_code == 201
        # A run for later is not claimable yet: no flag.
        await http.post("/v1/runs", json={"input": {}, "tenant_id": "acme", "delay_s": 3600})
        seen = await pools()
        assert (seen["batch"]["unserved"], seen["batch"]["claimable"]) == (True, True)
        assert (seen["default"]["unserved"], seen["default"]["claimable"]) == (False, False)
        one = (await http.get("/v1/pools/batch")).json()
        assert (one["service"]["unserved"], one["service"]["live_workers"]) == (True, 0)
        # A pool read is written back whole (as older clients do): `service` is ignored.
        back = await http.put("/v1/pools/batch", json={k: v for k, v in one.items()
                                                         if k != "name"})
        assert back.status_code == 200, back.text
        assert back.json() == one
        code, out, err = await cli(api, "pools", "list", who="admin")
        assert code == 0, err
        assert "WORKERS" in out
        assert "warning: pool batch has runs ready to claim and no live worker" in err
        assert "pool default" not in err

        # A live worker of the pool: served. Paused: not claimable, not flagged.
        await live_store.register_worker(Registration("w-batch:boot:1", "batch", 2), lease_s=60)
        seen = await pools()
        assert (seen["batch"]["unserved"], seen["batch"]["live_workers"]) == (False, 1)
        code, out, _ = await cli(api, "pools", "upsert", "batch", "--max-attempts", "5",
                                 who="admin")
        assert code == 0, out
        code, out, err = await cli(api, "pools", "list", who="admin")
        assert code == 0, err
        assert "warning" not in err
        await live_store.deregister_worker("w-batch:boot:1")
        assert (await pools())["batch"]["unserved"] is True
        paused = await http.put("/v1/pools/batch", json={"paused": True})
        assert paused.status_code == 200
        seen = await pools()
        assert (seen["batch"]["unserved"], seen["batch"]["claimable"]) == (False, False)
    # A tenant token does not see pools at all.
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        assert (await http.get("/v1/pools")).status_code == 403
