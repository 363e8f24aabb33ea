"""The smaller findings of the security review (issue 32, point 5), each
as a hostile tenant or outsider would try it: dates at the ends of the
calendar in filters, an unexpected agent error's text, a non-ASCII
Idempotency-Key, a tenant named `*`, cron strings with \\v \\f \\r, a
request whose headers never end, a console cookie after sign-out, guessing
tokens at the console's sign-in, tenants in a worker's /metrics."""

from __future__ import annotations

import asyncio
import re
import socket
from typing import Any

import httpx
import pytest

from runlease.api.auth import TokenRegistry
from runlease.client import AsyncClient, RunEnded
from runlease.core import bounds
from runlease.db.store import RunStore
from runlease.errors import SettingsError, ValidationError
from tests.support.api import Api, serve_api
from tests.support.workers import running_worker

ENDS = ["0001-01-01T00:00:00Z", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00",
        "9999-12-31T23:59:59Z"]


@pytest.mark.parametrize("at", ENDS)
async def test_dates_at_the_ends_of_the_calendar_are_filters_not_500s(api: Api, at: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        answers = [await http.get("/v1/runs", params={name: at}) for name in (
            "created_after", "created_before", "finished_after", "finished_before")]
        answers.append(await http.post("/v1/runs/cancel", json={
            "filter": {"created_after": at, "created_before": at}, "dry_run": True}))
        day = at[:10]
        answers.append(await http.get("/v1/usage", params={"from": day, "to": day}))
    assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]


async def test_console_dates_at_the_ends_of_the_calendar(ui: Api) -> None:
    async with httpx.AsyncClient(base_url=ui.url) as client:
        assert (await client.post("/ui/login", data={"token": ui.token("acme")})).status_code \
            == 303
        for at, tz in (("0001-01-01T00:00", "840"), ("9999-12-31T23:59", "-840")):
            r = await client.get("/ui/runs", params={"created_after": at, "created_before": at,
                                                     "tz": tz})
            assert r.status_code in (200, 400), r.text
            assert r.status_code != 500


async def test_an_unexpected_agent_error_names_no_server_path(
    api: Api, db_url: str, live_store: RunStore
) -> None:
    async def agent(ctx: Any) -> None:
        raise KeyError("boom")

    queued = await live_store.enqueue("default", "acme", {}, max_attempts=1)
    async with running_worker(db_url, agent=agent), \
            AsyncClient(api.url, api.token("acme")) as acme:
        ended = [i async for i in acme.events(queued.run.id)][-1]
        run = await acme.get(queued.run.id)
    assert isinstance(ended, RunEnded)
    assert ended.status == "dead"
    raw = await live_store.get(queued.run.id)
    assert raw.error_message is not None
    assert "KeyError: 'boom'" in raw.error_message
    # No /usr/..., /app/... or site-packages path: frames by file name.
    assert "/" not in raw.error_message, raw.error_message
    assert "test_hostile_small.py" in raw.error_message
    assert run.status == "dead"


@pytest.mark.parametrize("key", ["ключ-1", "clé", "键🔑"])
async def test_a_non_ascii_idempotency_key_is_kept_as_sent(api: Api, key: str) -> None:
    # The key's UTF-8 bytes on the wire, as a client sends a non-ASCII header.
    headers: dict[str, Any] = api.headers("acme") | {"Idempotency-Key": key.encode()}
    async with httpx.AsyncClient(base_url=api.url) as http:
        first = await http.post("/v1/runs", json={"input": {}}, headers=headers)
        again = await http.post("/v1/runs", json={"input": {}}, headers=headers)
        found = await http.get("/v1/runs", params={"idempotency_key": key, "tenant": "acme"},
                               headers=api.headers("acme"))
        # Another input under the same key: through the route, not the fast path.
        slow = await http.post("/v1/runs", json={"input": {"q": 2}},
                               headers=headers | {"X-Other": "1"})
    assert (first.status_code, again.status_code) == (201, 200), first.text
    assert first.json()["id"] == again.json()["id"]
    assert first.json()["idempotency_key"] == key
    assert [r["id"] for r in found.json()["items"]] == [first.json()["id"]]
    assert slow.status_code == 409  # another input under the same key


async def test_a_key_that_is_not_utf8_is_refused(api: Api) -> None:
    raw = b"\xff\xfekey"
    async with httpx.AsyncClient(base_url=api.url) as http:
        r = await http.post("/v1/runs", json={"input": {}}, headers=api.headers("acme") | {
            "Idempotency-Key": raw})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "Idempotency-Key"


async def test_a_tenant_cannot_be_named_star(api: Api) -> None:
    """`*` is the console session's name for admin."""
    with pytest.raises(ValidationError):
        bounds.check_tenant("*")
    with pytest.raises(SettingsError):
        TokenRegistry().add_tenant("*", "star-token-0123456789")
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        r = await http.post("/v1/runs", json={"input": {}, "tenant_id": "*"})
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("sep", ["\v", "\f", "\r", "\u00a0", "\u2003", "\n"])
async def test_cron_fields_are_split_by_spaces_and_tabs_only(api: Api, sep: str) -> None:
    """The document's pattern and the parser agree: \\s took \\v, \\f, \\r."""
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        bad = await http.post("/v1/schedules", json={
            "name": "x", "cron": f"*/5{sep}* * * *", "template": {"input": {}}})
        good = await http.post("/v1/schedules", json={
            "name": "y", "cron": "*/5\t* * * * ", "template": {"input": {}}})
    assert bad.status_code == 422, bad.text
    assert bad.json()["error"]["field"] in ("cron", "body.cron")
    assert good.status_code == 201, good.text


async def test_a_request_whose_headers_never_end_is_cut_off(db_url: str) -> None:
    async with serve_api(db_url, request_header_timeout_s=0.5) as api:
        host, port = api.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        cut = False
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            for _ in range(50):  # a byte every 0.1 s: no single gap is long
                await asyncio.sleep(0.1)
                writer.write(b"X")
                await writer.drain()
                if reader.at_eof():
                    break
            got = await asyncio.wait_for(reader.read(), 5)  # closed: EOF, no answer
            cut = got == b""
        except ConnectionError:
            cut = True
        writer.close()
        assert cut
        # A prompt request on the same server is answered.
        async with httpx.AsyncClient(base_url=api.url) as http:
            assert (await http.get("/healthz")).status_code == 200


async def test_a_console_cookie_is_dead_after_sign_out(ui: Api) -> None:
    async with httpx.AsyncClient(base_url=ui.url) as client:
        await client.post("/ui/login", data={"token": ui.token("acme")})
        page = await client.get("/ui/runs")
        assert page.status_code == 200
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None
        stolen = dict(client.cookies)
        out = await client.post("/ui/logout", data={"csrf": csrf.group(1)})
        assert out.status_code == 303
    async with httpx.AsyncClient(base_url=ui.url, cookies=stolen) as replay:
        r = await replay.get("/ui/runs")
    assert (r.status_code, r.headers.get("location")) == (303, "/ui/login")


async def test_sign_in_guesses_are_throttled(ui: Api) -> None:
    async with httpx.AsyncClient(base_url=ui.url) as client:
        codes = [(await client.post("/ui/login", data={"token": f"guess-{i:020d}"})).status_code
                 for i in range(12)]
        assert codes[:5] == [401] * 5
        assert codes[-1] == 429
        # Throttled means throttled: the right token is refused too, for now.
        right = await client.post("/ui/login", data={"token": ui.token("acme")})
        assert right.status_code == 429
        assert int(right.headers["Retry-After"]) >= 1


async def test_a_workers_metrics_name_no_tenant(db_url: str, live_store: RunStore) -> None:
    await live_store.enqueue("default", "acme-secret-customer", {"steps": []})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    async with running_worker(db_url, metrics_port=free, metrics_host="127.0.0.1") as worker:
        assert worker.probes is not None
        port = worker.probes.port
        async with httpx.AsyncClient() as http:
            for _ in range(100):
                text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                if "runlease_runs" in text and "acme-secret-customer" not in text:
                    break
                await asyncio.sleep(0.05)
    assert "acme-secret-customer" not in text
    # The operator's queue gauges (runlease_queue_*, by tenant: an admin's
    # view) share this test process's registry when operator tests ran
    # first; a worker process never sets them.
    named = [line for line in text.splitlines()
             if 'tenant="' in line and not line.startswith("runlease_queue_")]
    assert not named, named[:5]
