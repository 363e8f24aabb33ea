"""Humans in the loop (issue 28): a run waits for a person's input holding
no lease and no slot, is answered once (over HTTP, a resume link, a chat
message), and takes the messages sent to it exactly once."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

import httpx
import pytest

from runlease.client import AsyncClient, Conflict, NotFound
from runlease.db.models import Pool
from runlease.db.store import RunStore
from tests.support.api import Api
from tests.support.waiting import until
from tests.support.workers import running_worker

APPROVE = {"input": {"name": "approve", "prompt": "Deploy to production?",
                     "schema": {"type": "boolean"}}}


async def waiting(client: AsyncClient, run_id: Any, what: str = "the run to wait") -> Any:
    async def probe() -> Any:
        run = await client.get(run_id)
        return run if run.status == "waiting" else None
    return await until(probe, what=what)


async def test_a_waiting_run_holds_no_slot_and_resumes_once_with_the_answer(
    api: Api, db_url: str, live_store: RunStore
) -> None:
    """The tenant may run ONE run at a time: the second run can only start if
    the waiting one gave back its slot. It did, without an attempt charged;
    the answer resumed it, and the step before the wait was not run again."""
    await live_store.upsert_pool(Pool("default", default_max_in_flight=1))
    async with AsyncClient(api.url, api.token("acme")) as client, \
            running_worker(db_url, concurrency=4):
        first = await client.submit({"steps": [{"emit": {"text": "before"}}, APPROVE,
                                               {"emit": {"text": "after"}}]}, max_attempts=1)
        seen = await waiting(client, first.id)
        assert seen.lease is None
        assert seen.attempts == 0
        other = await client.submit({"steps": [{"sleep": 0.01}]})
        assert (await client.wait(other.id, timeout_s=30)).status == "done"
        [request] = await client.input_requests(first.id)
        assert request["open"]
        assert request["prompt"] == "Deploy to production?"
        assert request["schema"] == {"type": "boolean"}
        assert request["resume_url"].startswith(api.url + "/v1/resume/")
        answered = await client.give_input(first.id, "approve", True)
        assert answered["resumed"] is True
        again = await client.give_input(first.id, "approve", True)  # a repeat: no-op
        assert again["resumed"] is False
        with pytest.raises(Conflict):
            await client.give_input(first.id, "approve", False)  # another answer
        final = await client.wait(first.id, timeout_s=30)
    assert final.status == "done", final.error_message
    assert final.attempts == 1  # the wait charged none (max_attempts is 1)
    steps = {k: s.result for k, s in (await live_store.get_steps(first.id)).items()}
    assert steps["input:approve"] == {"value": True}
    assert steps["1"]["value"] is True
    events = [(e.kind, e.data) for e in await live_store.events_after(first.id)]
    kinds = [k for k, _ in events]
    assert kinds.count("message") == 2  # "before" once: replayed, not emitted again
    assert kinds.index("input.requested") < kinds.index("run.waiting") \
        < kinds.index("input.answered")
    assert [d for k, d in events if k == "input.answered"] == [
        {"name": "approve", "value": True, "by": "api"}]


async def test_answers_are_checked_and_another_tenant_sees_nothing(
    api: Api, db_url: str
) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            AsyncClient(api.url, api.token("globex")) as globex, \
            httpx.AsyncClient(base_url=api.url) as http, \
            running_worker(db_url, concurrency=2):
        run = await acme.submit({"steps": [{"input": {
            "name": "size", "schema": {"type": "integer", "minimum": 1, "maximum": 9}}}]})
        await waiting(acme, run.id)
        # Another tenant: the run does not exist for it, whatever the call.
        for call in (globex.input_requests(run.id), globex.give_input(run.id, "size", 3),
                     globex.send_message(run.id, "hi"), globex.messages(run.id)):
            with pytest.raises(NotFound):
                await call
        with pytest.raises(NotFound):
            await acme.give_input(uuid4(), "size", 3)
        hdr = api.headers("acme")
        bad = await http.post(f"/v1/runs/{run.id}/input", headers=hdr,
                              json={"name": "size", "value": 42})
        assert bad.status_code == 422, bad.text
        assert "maximum" in bad.json()["error"]["message"]
        wrong_type = await http.post(f"/v1/runs/{run.id}/input", headers=hdr,
                                     json={"name": "size", "value": "3; DROP TABLE"})
        assert wrong_type.status_code == 422
        never = await http.post(f"/v1/runs/{run.id}/input", headers=hdr,
                                json={"name": "other", "value": 1})
        assert never.status_code == 409
        assert never.json()["error"]["code"] == "input_refused"
        odd = await http.post(f"/v1/runs/{run.id}/input", headers=hdr,
                              json={"name": "../../etc", "value": 1})
        assert odd.status_code == 422
        huge = await http.post(f"/v1/runs/{run.id}/input", headers=hdr,
                               json={"name": "size", "value": "x" * 200_000})
        assert huge.status_code in (413, 422)
        assert (await acme.get(run.id)).status == "waiting"  # none of that resumed it
        ok = await http.post(f"/v1/runs/{run.id}/input", headers=hdr,
                             json={"name": "size", "value": 3})
        assert ok.status_code == 200, ok.text
        assert (await acme.wait(run.id, timeout_s=30)).status == "done"


async def test_a_resume_link_works_once_and_cannot_be_forged(
    api: Api, db_url: str, live_store: RunStore
) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            httpx.AsyncClient() as http, running_worker(db_url, concurrency=2):
        run = await acme.submit({"steps": [APPROVE]})
        await waiting(acme, run.id)
        [request] = await acme.input_requests(run.id)
        url = request["resume_url"]
        page = await http.get(url)  # what a link preview fetches: changes nothing
        assert page.status_code == 200
        assert "Deploy to production?" in page.text
        assert "Approve" in page.text
        assert "Deny" in page.text
        assert (await acme.get(run.id)).status == "waiting"
        token = url.rsplit("/", 1)[1]
        payload, mac = token.split(".")
        forged = f"{payload}.{mac[:-2]}{'AA' if mac[-2:] != 'AA' else 'BB'}"
        for bad in (forged, "x", "a.b", payload + ".", "." * 3, "%00"):
            answer = await http.post(f"{api.url}/v1/resume/{bad}",
                                     json={"value": True})
            assert answer.status_code in (404, 410), (bad, answer.text)
        # The browser's form post, no token.
        done = await http.post(url, data={"value": "true"})
        assert done.status_code == 200
        assert "Thank you" in done.text
        reused = await http.post(url, data={"value": "false"})
        assert reused.status_code == 409
        assert "once" in reused.text
        final = await acme.wait(run.id, timeout_s=30)
    assert final.status == "done"
    steps = await live_store.get_steps(run.id)
    assert steps["input:approve"].result == {"value": True}


async def test_cancel_of_a_waiting_run_ends_it_at_once(api: Api, db_url: str) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            running_worker(db_url, concurrency=1):
        run = await acme.submit({"steps": [APPROVE]})
        await waiting(acme, run.id)
        cancelled = await acme.cancel(run.id)
        assert cancelled.status == "cancelled"
        assert cancelled.finished_at is not None
        with pytest.raises(Conflict):
            await acme.give_input(run.id, "approve", True)


async def test_a_message_reaches_the_agent_once_and_a_chat_message_answers_a_free_text_wait(
    api: Api, db_url: str, live_store: RunStore
) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            running_worker(db_url, concurrency=2):
        run = await acme.submit({"steps": [
            {"receive": {"timeout_s": 60}},
            {"input": {"name": "reply", "prompt": "What next?"}},
            {"receive": {"timeout_s": 0.2}},
        ]})
        async def leased() -> bool:
            return (await acme.get(run.id)).status == "leased"
        await until(leased, what="the run to start")
        sent = await acme.send_message(run.id, "use the staging cluster", {"priority": 2})
        assert sent["seq"] == 1
        await waiting(acme, run.id)
        chat = await acme.send_message(run.id, "ship it")
        assert chat["answered_input"] == "reply"
        assert chat["seq"] is None
        final = await acme.wait(run.id, timeout_s=30)
        inbox = await acme.messages(run.id)
    assert final.status == "done", final.error_message
    steps = {k: s.result for k, s in (await live_store.get_steps(run.id)).items()}
    assert steps["0"]["message"]["text"] == "use the staging cluster"
    assert steps["0"]["message"]["data"] == {"priority": 2}
    assert steps["1"]["value"] == "ship it"
    assert steps["2"]["message"] is None  # nothing more came: the time was up
    assert [(m["seq"], m["taken"]) for m in inbox] == [(1, True)]
    assert final.messages == {"sent": 1, "taken": 1}


async def test_a_flood_of_messages_is_bounded(api: Api, db_url: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http, \
            AsyncClient(api.url, api.token("acme")) as acme:
        run = await acme.submit({"steps": [{"sleep": 600}]})  # no worker: never takes one
        answers = await asyncio.gather(*(
            http.post(f"/v1/runs/{run.id}/messages", json={"text": f"m{i}"})
            for i in range(130)))
        codes = sorted(a.status_code for a in answers)
        assert codes.count(202) == 100
        assert codes.count(429) == 30
        refused = next(a for a in answers if a.status_code == 429)
        assert refused.headers["Retry-After"]
        assert refused.json()["error"]["code"] == \
            "inbox_full"
        big = await http.post(f"/v1/runs/{run.id}/messages", json={"text": "x" * 40_000})
        assert big.status_code == 422
        await acme.cancel(run.id)
        late = await http.post(f"/v1/runs/{run.id}/messages", json={"text": "late"})
        assert late.status_code == 409
        seqs = [m["seq"] for m in await acme.messages(run.id, limit=500)]
    assert seqs == list(range(1, 101))


async def test_rerun_from_a_step_runs_no_step_before_it(
    api: Api, db_url: str, tmp_path: Any, live_store: RunStore
) -> None:
    from tests.support.workers import HOST_FILES
    log = tmp_path / "executions.log"

    def record(name: str) -> dict[str, Any]:
        return {"shell": ["sh", "-c", f"echo {name} >> {log}"]}
    steps = [record("fetch"), record("build"), {"shell": ["sh", "-c", "exit 3"]}]
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            AsyncClient(api.url, api.token("globex")) as globex, \
            AsyncClient(api.url, api.token("admin")) as admin, \
            running_worker(db_url, concurrency=2, **HOST_FILES):
        failed = await acme.submit({"steps": steps}, max_attempts=1)
        assert (await acme.wait(failed.id, timeout_s=30)).status == "dead"
        assert log.read_text().split() == ["fetch", "build"]
        with pytest.raises(NotFound):
            await globex.rerun(failed.id, from_step="2")
        fixed = {"steps": [*steps[:2], record("deploy")]}
        again = await acme.rerun(failed.id, from_step="2", input=fixed)
        assert again.rerun_of == failed.id
        assert again.tenant_id == "acme"
        done = await acme.wait(again.id, timeout_s=30)
        # From scratch (no from_step): every step runs again.
        fresh = await admin.rerun(again.id)
        assert (await admin.wait(fresh.id, timeout_s=30)).status == "done"
    assert done.status == "done", done.error_message
    assert log.read_text().split() == ["fetch", "build", "deploy", "fetch", "build", "deploy"]
    copied = await live_store.get_steps(again.id)
    assert sorted(copied) == ["0", "1", "2"]
    assert copied["0"].attempt == 0
    assert copied["2"].attempt == 1


async def test_steer_sends_the_submit_into_the_active_runs_inbox(
    api: Api, db_url: str, live_store: RunStore
) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http, \
            running_worker(db_url, concurrency=2):
        active = await acme.submit({"steps": [{"receive": {"timeout_s": 60}}]},
                                   thread_id="chat-7")
        async def leased() -> bool:
            return (await acme.get(active.id)).status == "leased"
        await until(leased, what="the thread's run to start")
        steer = await http.post("/v1/runs", json={
            "input": {"text": "actually, use Postgres 17"}, "thread_id": "chat-7",
            "multitask": "steer"})
        assert steer.status_code == 200, steer.text
        assert steer.json()["id"] == str(active.id)
        final = await acme.wait(active.id, timeout_s=30)
        runs = (await acme.thread_runs("chat-7")).items
        # An idle thread: a steer is a plain submit.
        idle = await http.post("/v1/runs", json={"input": {"steps": []}, "thread_id": "new-1",
                                                 "multitask": "steer"})
        assert idle.status_code == 201
    assert final.status == "done"
    steps = await live_store.get_steps(active.id)
    assert steps["0"].result["message"]["text"] == "actually, use Postgres 17"
    assert [r.id for r in runs] == [active.id]  # no run was made


async def test_the_cli_asks_answers_messages_and_reruns(api: Api, db_url: str) -> None:
    from click.testing import CliRunner

    from runlease.cli import main as cli

    async def cli_run(*args: str) -> Any:
        return await asyncio.to_thread(CliRunner().invoke, cli, [
            *args, "--api-url", api.url, "--token", api.token("acme")])

    async with AsyncClient(api.url, api.token("acme")) as acme, \
            running_worker(db_url, concurrency=2):
        run = await acme.submit({"steps": [APPROVE, {"receive": {"timeout_s": 30}}]})
        await waiting(acme, run.id)
        listed = await cli_run("runs", "input", str(run.id))
        assert listed.exit_code == 0, listed.output
        assert "approve" in listed.stdout
        assert "/v1/resume/" in listed.stdout
        bad = await cli_run("runs", "input", str(run.id), "--name", "approve")
        assert bad.exit_code == 2  # --name without --value: a usage error
        answered = await cli_run("runs", "input", str(run.id), "--name", "approve", "--value",
                             "true")
        assert answered.exit_code == 0, answered.output
        assert "resumes" in answered.stdout
        async def leased() -> bool:
            return (await acme.get(run.id)).status == "leased"
        await until(leased, what="the run to go on")
        sent = await cli_run("runs", "message", str(run.id), "all good", "--data", '{"n": 1}')
        assert sent.exit_code == 0, sent.output
        assert "message 1" in sent.stdout
        assert (await acme.wait(run.id, timeout_s=30)).status == "done"
        inbox = await cli_run("runs", "messages", str(run.id))
        assert "all good" in inbox.stdout
        again = await cli_run("runs", "rerun", str(run.id), "--from-step", "message:1", "-o",
                          "json")
        assert again.exit_code == 0, again.output
        assert '"rerun_of"' in again.stdout


async def test_an_expired_link_and_a_timed_out_wait(api: Api, db_url: str) -> None:
    """A request with timeout_s: its link expires with it (410), and the
    reaper's pass resumes the run, whose wait raises InputTimeout: dead with
    input_timeout, as the script agent does when it does not go on."""
    async with AsyncClient(api.url, api.token("acme")) as acme, httpx.AsyncClient() as http, \
            running_worker(db_url, concurrency=1):
        run = await acme.submit({"steps": [{"input": {"name": "approve", "timeout_s": 1}}]},
                                max_attempts=1)
        await waiting(acme, run.id)
        [request] = await acme.input_requests(run.id)
        final = await acme.wait(run.id, timeout_s=30)
        expired = await http.get(request["resume_url"])
        late = await http.post(request["resume_url"], json={"value": "yes"})
        [closed] = await acme.input_requests(run.id)
    assert final.status == "dead"
    assert final.error_code == "input_timeout"
    assert final.attempts == 1  # the wait charged none; the timed-out attempt did
    assert expired.status_code == 410
    assert late.status_code == 410
    assert closed["outcome"] == "timed_out"
    assert closed["answered_by"] == "timeout"
    assert closed["resume_url"] is None


async def test_waiting_runs_are_listed_and_dead_ones_rerun_in_bulk(api: Api, db_url: str) -> None:
    from runlease.client import Client

    async with AsyncClient(api.url, api.token("admin")) as admin, \
            running_worker(db_url, concurrency=4):
        asking = await admin.submit({"steps": [APPROVE]}, tenant_id="acme")
        broken = [await admin.submit({"steps": [{"fail": "fatal"}]}, tenant_id="globex",
                                     max_attempts=1) for _ in range(3)]
        for run in broken:
            assert (await admin.wait(run.id, timeout_s=30)).status == "dead"
        await waiting(admin, asking.id)

        def sync_view() -> tuple[list[Any], list[dict[str, Any]]]:
            with Client(api.url, api.token("acme")) as acme:
                return (acme.list(status="waiting").items, acme.input_requests(asking.id))
        listed, requests = await asyncio.to_thread(sync_view)
        assert [r.id for r in listed] == [asking.id]
        assert requests[0]["open"]
        async with httpx.AsyncClient(base_url=api.url) as http:
            by_tenant = await http.post("/v1/runs/rerun", headers=api.headers("acme"),
                                        json={"filter": {"status": ["dead"]}})
            assert by_tenant.status_code == 403  # admin only
            both = await http.post("/v1/runs/rerun", headers=api.headers("admin"),
                                   json={"ids": [str(broken[0].id)],
                                         "filter": {"status": ["dead"]}})
            assert both.status_code == 422
            bulk = await http.post("/v1/runs/rerun", headers=api.headers("admin"),
                                   json={"filter": {"status": ["dead"], "tenant_id": "globex"}})
            assert bulk.status_code == 201, bulk.text
        items = bulk.json()["items"]
        assert sorted(i["rerun_of"] for i in items) == sorted(str(r.id) for r in broken)
        assert {i["run"]["tenant_id"] for i in items} == {"globex"}
        await admin.cancel(asking.id)
