"""Threads over HTTP (issue 27): submit into a thread with each multitask
policy, read the thread and its runs, and what a hostile caller gets."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import httpx
import pytest

from runlease.client import ApiError, AsyncClient
from runlease.worker.context import RunContext
from tests.console.test_console_http import signed_in
from tests.support.api import Api
from tests.support.waiting import until
from tests.support.workers import running_worker


async def test_a_threads_runs_and_the_thread_over_http(api: Api) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client:
        first = await client.submit({"steps": []}, thread_id="conv-1")
        second = await client.submit({"steps": []}, thread_id="conv-1")
        other = await client.submit({"steps": []})
        assert (first.thread_id, second.thread_id, other.thread_id) == ("conv-1", "conv-1", None)
        thread = await client.thread("conv-1")
        assert thread["head_run_id"] == str(first.id)
        assert (thread["runs"], thread["head_status"]) == (2, "pending")
        page = await client.thread_runs("conv-1")
        assert [r.id for r in page.items] == [first.id, second.id]
        one = await client.thread_runs("conv-1", limit=1)
        assert [r.id for r in one.items] == [first.id]
        rest = await client.thread_runs("conv-1", limit=1, cursor=one.next_cursor)
        assert [r.id for r in rest.items] == [second.id]
        listed = await client.list(thread_id="conv-1")
        assert {r.id for r in listed.items} == {first.id, second.id}


async def test_reject_answers_409_naming_the_active_run(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        first = (await http.post("/v1/runs", json={"input": {}, "thread_id": "c"})).json()
        busy = await http.post("/v1/runs", json={"input": {}, "thread_id": "c",
                                                 "multitask": "reject"})
        assert busy.status_code == 409
        assert busy.json()["error"]["code"] == "thread_busy"
        assert busy.json()["active_run_id"] == first["id"]
        assert first["id"] in busy.json()["error"]["message"]
        runs = (await http.get("/v1/threads/c/runs")).json()["items"]
        assert [r["id"] for r in runs] == [first["id"]]  # the refused one left nothing


@pytest.mark.parametrize("policy", ["interrupt", "rollback"])
async def test_interrupt_stops_the_active_run_inside_its_tool(api: Api, db_url: str,
                                                              policy: str) -> None:
    """Each interrupting policy over HTTP, the active run inside a tool: its
    tool's process is gone, its committed step kept, the new run runs after."""
    marker = f"{3100 + len(policy)}.5"  # this test's own sleep, to find its process
    plan = {"steps": [{"emit": {"text": "start"}}, {"shell": ["sh", "-c", f"sleep {marker}"]}]}
    async with AsyncClient(api.url, api.token("acme")) as client, running_worker(db_url):
        old = await client.submit(plan, thread_id="c")
        await until(lambda: _leased(client, old.id))
        await until(lambda: _sleeping(marker))  # inside its tool
        new = await client.submit({"steps": [{"emit": {"n": 2}}]}, thread_id="c",
                                  multitask=policy)
        ended = await client.wait(old.id, timeout_s=30)
        assert (ended.status, ended.rolled_back) == ("cancelled", policy == "rollback")
        assert not await _sleeping(marker)  # the tool's process was killed
        done = await client.wait(new.id, timeout_s=30)
        assert (done.status, done.rolled_back) == ("done", False)
        assert done.finished_at is not None
        assert ended.finished_at is not None
        assert ended.finished_at <= done.finished_at
        thread = await client.thread("c")
        assert thread["latest_run_id"] == str(new.id)
        kept = await client.steps(old.id)  # its committed step stays
        assert [s.key for s in kept.items] == ["0"]


async def _sleeping(marker: str) -> bool:
    return await asyncio.to_thread(_sleeping_now, marker)


def _sleeping_now(marker: str) -> bool:
    """Whether a process of this machine runs `sleep <marker>`."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes() == f"sleep\0{marker}\0".encode():
                return True
        except OSError:
            continue
    return False


async def _leased(client: AsyncClient, run_id: object) -> bool:
    return (await client.get(str(run_id))).status == "leased"


async def test_another_tenants_thread_is_invisible(api: Api) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            AsyncClient(api.url, api.token("globex")) as globex:
        mine = await acme.submit({"steps": []}, thread_id="secret")
        with pytest.raises(ApiError) as missing:
            await globex.thread("secret")
        assert missing.value.status == 404
        with pytest.raises(ApiError):
            await globex.thread_runs("secret")
        assert (await globex.list(thread_id="secret")).items == []
        # Globex's own thread of the same name is its own, never joined to acme's.
        theirs = await globex.submit({"steps": []}, thread_id="secret", multitask="reject")
        assert theirs.id != mine.id
        with pytest.raises(ApiError) as forbidden:
            await globex.thread("secret", tenant="acme")
        assert forbidden.value.status == 403


@pytest.mark.parametrize("body", [
    {"thread_id": "x" * 129}, {"thread_id": ""}, {"thread_id": "a b"}, {"thread_id": "a/b"},
    {"thread_id": "\u00fc"}, {"thread_id": "a\u0000b"}, {"thread_id": 7},
    {"thread_id": ["c"]}, {"thread_id": "c", "multitask": "steal"},
    {"multitask": "reject"}, {"thread_id": "-c"},
])
async def test_odd_thread_input_is_a_422(api: Api, body: dict[str, object]) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        answer = await http.post("/v1/runs", json={"input": {}, **body})
        assert answer.status_code == 422, answer.text
        batch = await http.post("/v1/runs/batch", json={"runs": [{"input": {}, **body}]})
        assert batch.status_code == 422, batch.text


async def test_odd_thread_reads_are_refused_never_a_500(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        for path in ("/v1/threads/" + "x" * 129, "/v1/threads/%00", "/v1/threads/a%20b",
                     "/v1/threads/..", "/v1/threads/c/runs?cursor=-1",
                     "/v1/threads/c/runs?cursor=99999999999999999999",
                     "/v1/threads/c/runs?limit=0", "/v1/runs?thread_id=a%2Fb"):
            answer = await http.get(path)
            assert answer.status_code in (404, 422), (path, answer.status_code, answer.text)
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        answer = await http.get("/v1/threads/c")
        assert answer.status_code == 403  # an admin names the tenant
        assert (await http.get("/v1/threads/c", params={"tenant": "acme"})).status_code == 404
        assert (await http.get("/v1/runs", params={"thread_id": "c"})).status_code in (403, 422)


async def test_a_batch_item_goes_into_its_thread(api: Api) -> None:
    """Once refused (422); now as a single submit (test_keyed_paths.py has the rest)."""
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        answer = await http.post("/v1/runs/batch", json={"runs": [
            {"input": {}}, {"input": {}, "thread_id": "c"}]})
        assert answer.status_code == 201
        thread = (await http.get("/v1/threads/c")).json()
        assert thread["head_run_id"] == answer.json()["runs"][1]["id"]


async def _echo_thread(ctx: RunContext) -> dict[str, object]:
    return {"thread": ctx.thread_id}


async def test_the_agent_sees_its_thread(api: Api, db_url: str) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client, \
            running_worker(db_url, agent=_echo_thread):
        run = await client.submit({}, thread_id="conv-7")
        plain = await client.submit({})
        assert (await client.wait(run.id, timeout_s=30)).result == {"thread": "conv-7"}
        assert (await client.wait(plain.id, timeout_s=30)).result == {"thread": None}


async def _cli(api: Api, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "RUNLEASE_API_URL": api.url, "RUNLEASE_TOKEN": api.token("acme"),
           "COLUMNS": "200"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlease", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_cli_submits_into_a_thread_and_shows_it(api: Api) -> None:
    code, out, err = await _cli(api, "runs", "submit", "--input", "{}", "--thread", "cli-1",
                                "--json")
    assert code == 0, err
    first = json.loads(out)
    assert first["thread_id"] == "cli-1"
    code, out, err = await _cli(api, "runs", "submit", "--input", "{}", "--thread", "cli-1",
                                "--multitask", "reject")
    assert code != 0
    assert "thread_busy" in out + err
    code, out, err = await _cli(api, "threads", "show", "cli-1", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["thread"]["head_run_id"] == first["id"]
    assert [r["id"] for r in shown["runs"]] == [first["id"]]
    code, out, err = await _cli(api, "runs", "list", "--thread", "cli-1", "--json")
    assert code == 0, err
    assert first["id"] in out


async def test_the_console_shows_a_runs_thread(ui: Api) -> None:
    async with AsyncClient(ui.url, ui.token("acme")) as client:
        runs = [await client.submit({}, thread_id="conv-ui") for _ in range(7)]
        await client.submit({}, thread_id="conv-ui-2")  # another thread: not a neighbour
    waiting = runs[3]
    async with signed_in(ui, "acme") as http:
        page = await http.get(f"/ui/runs/{waiting.id}/summary")
    assert page.status_code == 200, page.text
    assert "conv-ui" in page.text
    assert "after the thread's earlier runs" in page.text
    # Its neighbours, two before and two after, linked in submit order.
    shown = re.findall(r'href="/ui/runs/([0-9a-f-]{36})"', page.text.split(
        'id="thread-neighbours"')[1].split("</ol>")[0])
    assert shown == [str(r.id) for r in (runs[1], runs[2], runs[4], runs[5])]
    assert "this run" in page.text
