"""The HTTP API end to end: a real server, a real worker, a real PostgreSQL."""

from __future__ import annotations

import json
import time
from typing import Any
from uuid import UUID, uuid4

import httpx
import psycopg
import pytest

from runlease.client import AsyncClient, RunEnded, RunView, SseParser, StreamEvent
from runlease.db.store import RunStore
from tests.support.api import Api, serve_api
from tests.support.waiting import until
from tests.support.workers import running_worker


def count_runs(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        return int(conn.execute("SELECT count(*) FROM agent_runs").fetchone()[0])  # type: ignore[index]


def emits(n: int, pause: float = 0.05) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for i in range(n):
        steps += [{"emit": {"i": i}}, {"sleep": pause}]
    return {"steps": steps}


async def test_submit_events_done_end_to_end(api: Api, db_url: str) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client, running_worker(db_url):
        run = await client.submit(emits(3), pool="default", priority=2, max_attempts=2,
                                  budget={"max_turns": 5})
        assert (run.status, run.tenant_id, run.priority, run.max_attempts) == (
            "pending", "acme", 2, 2)
        assert run.budget == {"max_turns": 5}
        items = [item async for item in client.events(run.id)]
        final = await client.get(run.id)
    events = [i for i in items if isinstance(i, StreamEvent)]
    assert [e.data["i"] for e in events] == [0, 1, 2]
    assert [e.seq for e in events] == [1, 2, 3]
    assert items[-1] == RunEnded("done", None, 1)
    assert final.status == "done"
    assert final.result == {"steps": 6}
    assert final.lease is None  # tenants never see who holds a run


async def test_cancel_while_running(api: Api, db_url: str) -> None:
    plan = {"steps": [{"emit": {"text": "start"}}, {"shell": ["sh", "-c", "sleep 300"]}]}
    async with AsyncClient(api.url, api.token("acme")) as client, running_worker(db_url):
        run = await client.submit(plan)
        async for item in client.events(run.id):
            assert isinstance(item, StreamEvent)
            break  # the run is running: its first event is out
        cancelled = await client.cancel(run.id)
        assert cancelled.status == "leased"
        assert cancelled.cancel_requested_at is not None
        final = await client.wait(run.id, timeout_s=20)
    assert (final.status, final.attempts) == ("cancelled", 1)


async def test_cancel_of_a_pending_run_and_closing_a_stream_cancels_nothing(
    api: Api, db_url: str
) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client:
        kept = await client.submit({"steps": []})
        async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as raw, \
                raw.stream("GET", f"/v1/runs/{kept.id}/events") as stream:
            await anext(stream.aiter_lines())  # connected; then drop the connection
        assert (await client.get(kept.id)).status == "pending"
        gone = await client.cancel(kept.id)
        assert gone.status == "cancelled"


async def test_idempotency_key(api: Api, db_url: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        first = await http.post("/v1/runs", json={"input": {"q": 1}},
                                headers={"Idempotency-Key": "order-42"})
        again = await http.post("/v1/runs", json={"input": {"q": 1}},
                                headers={"Idempotency-Key": "order-42"})
        other = await http.post("/v1/runs", json={"input": {"q": 2}},
                                headers={"Idempotency-Key": "order-42"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert first.headers["location"] == f"/v1/runs/{first.json()['id']}"
    assert other.status_code == 409
    assert other.json()["error"]["field"] == "Idempotency-Key"
    assert count_runs(db_url) == 1


async def read_until_dropped(api: Api, run_id: UUID, last: int, take: int) -> list[dict[str, Any]]:
    """Open the stream after `last`, read `take` events, then drop the connection."""
    got: list[dict[str, Any]] = []
    parser = SseParser()
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme"),
                                 timeout=30) as http:
        headers = {"Last-Event-ID": str(last)} if last else {}
        async with http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as r:
            async for line in r.aiter_lines():
                item = parser.feed(line)
                if isinstance(item, StreamEvent):
                    got.append({"seq": item.seq, "kind": item.kind, "data": item.data})
                    if len(got) == take:
                        return got
                if isinstance(item, RunEnded):
                    got.append({"end": item.status})
                    return got
    return got


async def test_sse_resume_loses_nothing_and_repeats_nothing(
    api: Api, db_url: str, live_store: RunStore
) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client, running_worker(db_url):
        run = await client.submit(emits(30, pause=0.02))
        seen: list[dict[str, Any]] = []
        last = 0
        while not seen or "end" not in seen[-1]:
            chunk = await read_until_dropped(api, run.id, last, take=4)
            seen += chunk
            last = max([e["seq"] for e in seen if "seq" in e], default=last)
    stored = [{"seq": e.seq, "kind": e.kind, "data": e.data}
              for e in await live_store.events_after(run.id)]
    assert seen[-1] == {"end": "done"}
    assert seen[:-1] == stored
    assert len(stored) == 30


async def test_sse_resume_across_a_worker_failover(
    api: Api, db_url: str, live_store: RunStore, tmp_path: Any
) -> None:
    from tests.support.proc import WorkerProcess

    settings = {"agent": "runlease.agents.script:agent", "lease_s": 3,
                "heartbeat_interval_s": 1, "reaper_interval_s": 0.5, "leader_ttl_s": 2,
                "poll_interval_s": 0.3}
    first = WorkerProcess(db_url, tmp_path, "first", settings).start()
    second = None
    try:
        async with AsyncClient(api.url, api.token("acme")) as client:
            run = await client.submit(emits(20, pause=0.15), max_attempts=3)
            seen = await read_until_dropped(api, run.id, 0, take=5)
            first.kill9()  # mid-run: its lease expires, the run resumes elsewhere
            second = WorkerProcess(db_url, tmp_path, "second", settings).start()
            last = seen[-1]["seq"]
            while "end" not in seen[-1]:
                chunk = await read_until_dropped(api, run.id, last, take=7)
                seen += chunk
                last = max(e["seq"] for e in seen if "seq" in e)
        stored = [{"seq": e.seq, "kind": e.kind, "data": e.data}
                  for e in await live_store.events_after(run.id)]
        assert seen[-1] == {"end": "done"}
        assert seen[:-1] == stored
        assert "run.lease_expired" in [e["kind"] for e in stored]
        assert (await live_store.get(run.id)).attempts == 2
    finally:
        first.cleanup()
        if second is not None:
            second.cleanup()


async def test_a_stream_ends_when_the_run_does(api: Api, db_url: str) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client:
        run = await client.submit({"steps": []})
        await client.cancel(run.id)
        items = [i async for i in client.events(run.id)]
    assert [type(i).__name__ for i in items] == ["StreamEvent", "RunEnded"]
    assert items[-1] == RunEnded("cancelled", None, 0)


async def test_keepalive_comments_on_an_idle_stream(api: Api) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client:
        run = await client.submit({"steps": []})
    lines: list[str] = []
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http, \
            http.stream("GET", f"/v1/runs/{run.id}/events") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        started = time.monotonic()
        async for line in r.aiter_lines():
            lines.append(line)
            if line.startswith(": keepalive") or time.monotonic() - started > 5:
                break
    assert ": keepalive" in lines


async def test_stream_tokens_open_one_runs_stream_only(api: Api) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client:
        run = await client.submit({"steps": []})
        other = await client.submit({"steps": []})
        await client.cancel(run.id)
        issued = await client._send(client._calls.stream_token(run.id))
    async with httpx.AsyncClient(base_url=api.url) as anonymous:
        ok = await anonymous.get(issued["url"])
        wrong_run = await anonymous.get(f"/v1/runs/{other.id}/events",
                                        params={"token": issued["token"]})
        forged = await anonymous.get(f"/v1/runs/{run.id}/events",
                                     params={"token": issued["token"][:-2] + "xx"})
        none = await anonymous.get(f"/v1/runs/{run.id}/events")
    assert ok.status_code == 200
    assert "event: end" in ok.text
    assert (wrong_run.status_code, forged.status_code, none.status_code) == (401, 401, 401)


ROUTES = [
    ("GET", "/v1/runs/{id}", None),
    ("POST", "/v1/runs/{id}/cancel", None),
    ("GET", "/v1/runs/{id}/events", None),
    ("GET", "/v1/runs/{id}/steps", None),
    ("POST", "/v1/runs/{id}/stream-token", None),
]
ADMIN_ROUTES = [
    ("GET", "/v1/dead-letters", None),
    ("POST", "/v1/runs/{id}/redrive", None),
    ("GET", "/v1/pools", None),
    ("PUT", "/v1/pools/x", {"max_attempts": 2}),
]


async def test_tenant_isolation_on_every_route(api: Api, db_url: str) -> None:
    async with httpx.AsyncClient(base_url=api.url) as http:
        created = await http.post("/v1/runs", json={"input": {"secret": "acme's"}},
                                  headers=api.headers("acme"))
        run_id = created.json()["id"]
        for method, path, body in ROUTES:
            url = path.format(id=run_id)
            other = await http.request(method, url, json=body, headers=api.headers("globex"))
            assert other.status_code == 404, (method, url, other.text)
            assert "acme" not in other.text
            nobody = await http.request(method, url, json=body)
            assert nobody.status_code == 401, (method, url)
            wrong = await http.request(method, url, json=body,
                                       headers={"Authorization": "Bearer not-a-token"})
            assert wrong.status_code == 401, (method, url)
        for method, path, body in ADMIN_ROUTES:
            url = path.format(id=run_id)
            tenant = await http.request(method, url, json=body, headers=api.headers("acme"))
            assert tenant.status_code == 403, (method, url)
            assert (await http.request(method, url, json=body)).status_code == 401
        listed = await http.get("/v1/runs", headers=api.headers("globex"))
        assert listed.json() == {"items": [], "next_cursor": None}
        assert (await http.get("/v1/runs")).status_code == 401
        assert (await http.post("/v1/runs", json={"input": {}})).status_code == 401
        # The owner still sees it, unchanged; admin sees it with its lease details.
        mine = await http.get(f"/v1/runs/{run_id}", headers=api.headers("acme"))
        assert (mine.status_code, mine.json()["status"]) == (200, "pending")
        everyone = await http.get("/v1/runs", headers=api.headers("admin"))
        assert [r["id"] for r in everyone.json()["items"]] == [run_id]


async def test_admins_see_leases_and_redrive_dead_letters(api: Api, db_url: str) -> None:
    async with AsyncClient(api.url, api.token("acme")) as tenant, \
            AsyncClient(api.url, api.token("admin")) as ops, running_worker(db_url):
        dead = await tenant.submit({"steps": [{"fail": "fatal"}]})
        await tenant.wait(dead.id, timeout_s=10)
        letters = await ops.dead_letters()
        assert [r.id for r in letters.items] == [dead.id]
        redriven = await ops.redrive(dead.id)
        assert (redriven.status, redriven.attempts) == ("pending", 0)
        long = await tenant.submit({"steps": [{"sleep": 30}]})

        async def leased() -> RunView | None:
            seen = await ops.get(long.id)
            return seen if seen.status == "leased" else None

        seen = await until(leased, timeout_s=5, what="the run to be leased")
        assert seen.lease is not None
        assert seen.lease["locked_by"].startswith("test-worker-")
        assert (await tenant.get(long.id)).lease is None
        await tenant.cancel(long.id)


BAD = [
    ("malformed JSON", b'{"input": {', "body", 422),
    ("not even UTF-8", b'\xff\xfe{"inp', "body", 422),
    ("not an object", json.dumps({"input": [1, 2]}).encode(), "input", 422),
    ("input over the bound", json.dumps({"input": {"x": "y" * 300_000}}).encode(), "input",
     422),
    ("body over the bound", json.dumps({"input": {"x": "y" * 1_100_000}}).encode(), "body",
     413),
    ("unknown pool", json.dumps({"input": {}, "pool": "nope"}).encode(), "pool", 422),
    ("bad pool name", json.dumps({"input": {}, "pool": "Nope!"}).encode(), "pool", 422),
    ("priority too high", json.dumps({"input": {}, "priority": 101}).encode(), "priority", 422),
    ("priority a string", json.dumps({"input": {}, "priority": "1"}).encode(), "priority", 422),
    ("max_attempts zero", json.dumps({"input": {}, "max_attempts": 0}).encode(),
     "max_attempts", 422),
    ("budget turns a string", json.dumps({"input": {}, "budget": {"max_turns": "5"}}).encode(),
     "budget.max_turns", 422),
    ("budget unknown field", json.dumps({"input": {}, "budget": {"tokens": 5}}).encode(),
     "budget.tokens", 422),
    ("an unknown field", json.dumps({"input": {}, "colour": "red"}).encode(), "colour", 422),
    ("tenant_id of another", json.dumps({"input": {}, "tenant_id": "globex"}).encode(),
     "tenant_id", 422),
]


@pytest.mark.parametrize(("body", "field", "status"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
async def test_bad_input_names_the_field_and_writes_nothing(
    api: Api, db_url: str, body: bytes, field: str, status: int
) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        response = await http.post("/v1/runs", content=body,
                                   headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["field"] == field, error
    assert field.split(".")[0] in error["message"] or field == "body"
    assert count_runs(db_url) == 0


async def test_bad_query_and_path_parameters(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        cases = {
            "/v1/runs?limit=0": "limit",
            "/v1/runs?status=running": "status",
            "/v1/runs?cursor=nope": "cursor",
            "/v1/runs/not-a-uuid": "run_id",
            f"/v1/runs/{uuid4()}/events?after=-1": "after",
        }
        for url, field in cases.items():
            response = await http.get(url)
            assert response.status_code == 422, url
            assert response.json()["error"]["field"] == field, url
        missing = await http.get(f"/v1/runs/{uuid4()}")
        assert missing.status_code == 404


async def test_keyset_pagination(api: Api) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client:
        ids = [(await client.submit({"i": i})).id for i in range(7)]
        pages, cursor = [], None
        while True:
            page = await client.list(limit=3, cursor=cursor)
            pages.append([r.id for r in page.items])
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i for p in pages for i in p] == list(reversed(ids))


async def test_probes_and_metrics(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url) as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).json() == {"status": "ready"}
        await http.get("/v1/runs", headers=api.headers("acme"))
        text = (await http.get("/metrics")).text
        spec = (await http.get("/openapi.json")).json()
    assert 'runlease_api_requests_total{method="GET",route="/v1/runs",status="200"}' in text
    assert "/v1/runs/{run_id}/events" in spec["paths"]


async def test_a_tenant_past_its_open_streams_gets_429_and_others_do_not(db_url: str) -> None:
    # One tenant opening streams without end cannot take the server's
    # streams from the others: past its cap a new stream is refused, and a
    # closed stream frees its place.
    async with serve_api(db_url, sse_max_streams_per_tenant=2) as api:
        async with AsyncClient(api.url, api.token("acme")) as client:
            run = await client.submit({"steps": []})
        async with AsyncClient(api.url, api.token("globex")) as client:
            other = await client.submit({"steps": []})
        url = f"/v1/runs/{run.id}/events"
        async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http, \
                httpx.AsyncClient(base_url=api.url, headers=api.headers("globex")) as http2, \
                httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as admin:
            async with http.stream("GET", url) as first, http.stream("GET", url) as second:
                assert (first.status_code, second.status_code) == (200, 200)
                refused = await http.get(url)
                assert refused.status_code == 429
                assert refused.json()["error"]["code"] == "too_many_streams"
                assert refused.headers["Retry-After"] == "5"
                async with http2.stream("GET", f"/v1/runs/{other.id}/events") as theirs:
                    assert theirs.status_code == 200
                async with admin.stream("GET", url) as ops:
                    assert ops.status_code == 200  # admins are not capped

            async def reopened() -> bool:
                async with http.stream("GET", url) as again:
                    return again.status_code == 200

            await until(reopened, timeout_s=10, what="a closed stream freeing its place")
