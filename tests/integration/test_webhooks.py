"""Completion webhooks: delivered once, signed, after the endpoint failed
twice; URLs held to the admin's allowlist and to public addresses; a
tenant sees its own deliveries only."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from runlease.cli import main as cli
from runlease.client import AsyncClient, NotFound
from runlease.core.webhooks import HostRule, verify
from runlease.db.store import RunStore
from runlease.services import webhooks as webhooks_module
from runlease.services.webhooks import WebhookSender
from tests.support.api import Api
from tests.support.waiting import until
from tests.support.workers import running_worker


@dataclass
class Receiver:
    """An HTTP endpoint answering with the scripted statuses, then 200."""

    statuses: list[int]
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")[1:]
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.received.append((headers, body))
        status = self.statuses.pop(0) if self.statuses else 200
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                     .encode())
        await writer.drain()
        writer.close()


@asynccontextmanager
async def receiver(*statuses: int) -> AsyncIterator[Receiver]:
    r = Receiver(list(statuses))
    server = await asyncio.start_server(r.handle, "127.0.0.1", 0)
    r.port = server.sockets[0].getsockname()[1]
    try:
        yield r
    finally:
        server.close()
        await server.wait_closed()


async def allow(api: Api, *hosts: tuple[str, bool] | tuple[str, bool, list[int]]) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        response = await http.put("/v1/webhook-hosts", json={
            "hosts": [{"host": h[0], "allow_private": h[1], "ports": list(h[2:][0] if h[2:]
                                                                          else [])}
                      for h in hosts]})
    assert response.status_code == 200, response.text


async def test_a_webhook_is_delivered_once_signed_after_two_failures(
    api: Api, db_url: str
) -> None:
    async with receiver(500, 503) as hook, \
            AsyncClient(api.url, api.token("acme")) as client:
        await allow(api, ("127.0.0.1", True, [hook.port]))
        async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
            secret = (await http.get("/v1/webhook-secret")).json()["secret"]
        run = await client.submit({"steps": []},
                                  webhook_url=f"http://127.0.0.1:{hook.port}/hook")
        async with running_worker(db_url, reaper_interval_s=0.2):
            async def delivered() -> dict[str, Any] | None:
                found = await client.webhook(run.id)
                return found if found["state"] == "delivered" else None
            delivery = await until(delivered, timeout_s=60, what="the webhook's delivery")
    assert [a.get("status_code") for a in delivery["attempts"]] == [500, 503, 200]
    assert delivery["tries"] == 3
    assert len(hook.received) == 3  # and none after the one that succeeded
    for headers, body in hook.received:
        assert verify(secret, headers, body, now=time.time())
        assert not verify("whsec_other", headers, body, now=time.time())
        assert not verify(secret, headers, body + b" ", now=time.time())
        # A replay much later is refused by the timestamp.
        assert not verify(secret, headers, body, now=time.time() + 3600)
    sent = json.loads(hook.received[-1][1])
    assert (sent["run_id"], sent["status"], sent["tenant_id"]) == (str(run.id), "done", "acme")
    # One delivery, one id on every try (issue 32: it changed with each try,
    # so a receiver could not drop a repeat).
    assert {json.loads(b)["delivery_id"] for _, b in hook.received} == {str(run.id)}
    assert [json.loads(b)["try"] for _, b in hook.received] == [1, 2, 3]
    assert [a.get("error") for a in delivery["attempts"]] == ["http_status", "http_status",
                                                                None]


@pytest.mark.parametrize(("url", "status"), [
    # Well formed, off the admin's allowlist: not permitted.
    ("http://169.254.169.254/latest/meta-data", 403), ("http://localhost:8080/x", 403),
    ("http://evil.example.com/hook", 403), ("http://hooks.example.com.evil.net/x", 403),
    # Malformed: refused as the document's pattern says.
    ("ftp://127.0.0.1/x", 422), ("http://user:pw@127.0.0.1/x", 422),
    ("http://127.0.0.1:99999/x", 422), ("http:///nohost", 422), ("not a url", 422),
    ("http://127.0.0.1/" + "a" * 3000, 422),
])
async def test_webhook_urls_off_the_allowlist_are_refused(api: Api, db_url: str, url: str,
                                                          status: int) -> None:
    await allow(api, ("127.0.0.1", True), ("*.hooks.example.com", False))
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        response = await http.post("/v1/runs", json={"input": {}, "webhook_url": url})
    assert response.status_code == status, response.text
    assert response.json()["error"]["field"] in ("webhook_url", "body.webhook_url")


async def test_an_allowed_host_resolving_to_a_private_address_is_not_called(
    live_store: RunStore
) -> None:
    async with receiver() as hook:
        await live_store.set_webhook_hosts([HostRule("localhost", False, (hook.port,)),
                                            ("*.example.com", False)])
        url = f"http://localhost:{hook.port}/hook"
        queued = await live_store.enqueue("default", "acme", {})
        await live_store.add_webhook(queued.run.id, "acme", url)
        (lease,) = await live_store.claim("default", "w", 1)
        await live_store.ack(lease, None)
        assert await WebhookSender(live_store).run_once() == 1
        assert hook.received == []
    found = await live_store.webhook(queued.run.id)
    assert found is not None
    assert found["state"] == "failed"
    assert found["attempts"][0]["error"] == "private_address"
    assert await live_store.webhook(queued.run.id, tenant_id="globex") is None


async def test_a_waiting_run_is_not_delivered_and_tenants_see_their_own(
    api: Api, live_store: RunStore
) -> None:
    await allow(api, ("127.0.0.1", True, [9]))
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            AsyncClient(api.url, api.token("globex")) as globex:
        run = await acme.submit({}, webhook_url="http://127.0.0.1:9/hook")
        assert await WebhookSender(live_store).run_once() == 0  # not finished yet
        assert (await acme.webhook(run.id))["state"] == "waiting"
        with pytest.raises(NotFound):
            await globex.webhook(run.id)
    async with httpx.AsyncClient(base_url=api.url) as http:
        mine = await http.get("/v1/webhook-secret", headers=api.headers("acme"))
        theirs = await http.get("/v1/webhook-secret", params={"tenant_id": "acme"},
                                headers=api.headers("globex"))
        rotated = await http.post("/v1/webhook-secret/rotate", headers=api.headers("acme"))
        hosts = await http.get("/v1/webhook-hosts", headers=api.headers("acme"))
    assert theirs.status_code == 403
    assert rotated.json()["secret"] != mine.json()["secret"]
    assert hosts.status_code == 403


async def test_the_cli_sets_hosts_and_shows_the_key(api: Api) -> None:
    def run(who: str, *args: str) -> Any:
        result = CliRunner().invoke(cli, [*args, "--api-url", api.url, "--token",
                                          api.token(who)])
        assert result.exit_code == 0, result.output
        return result.stdout

    out = await asyncio.to_thread(run, "admin", "webhooks", "hosts", "--set",
                                  "127.0.0.1:private@8080,8443", "--set", "*.hooks.example.com",
                                  "--json")
    assert json.loads(out)["hosts"] == [
        {"host": "*.hooks.example.com", "allow_private": False, "ports": []},
        {"host": "127.0.0.1", "allow_private": True, "ports": [8080, 8443]}]
    key = (await asyncio.to_thread(run, "acme", "webhooks", "secret")).strip()
    async with AsyncClient(api.url, api.token("acme")) as client:
        assert await client.webhook_secret() == key
        assert await client.webhook_secret(rotate=True) != key


@pytest.mark.parametrize(("url", "sent_to", "sni"), [
    ("https://hooks.example.com/done?x=1", "https://93.184.216.34/done?x=1", "hooks.example.com"),
    ("http://hooks.example.com:8443/done", "http://93.184.216.34:8443/done", None),
])
async def test_a_delivery_connects_to_the_address_it_checked(
    live_store: RunStore, monkeypatch: pytest.MonkeyPatch, url: str, sent_to: str,
    sni: str | None,
) -> None:
    """DNS rebinding: the host's name resolves to a public address when
    checked; the request goes to that address (the name kept for Host and
    TLS), never to what a second lookup would answer."""
    lookups: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        lookups.append(host)  # a rebinding resolver would answer 127.0.0.1 next time
        return ["93.184.216.34"] if len(lookups) == 1 else ["127.0.0.1"]

    monkeypatch.setattr(webhooks_module, "_addresses", resolve)
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    await live_store.set_webhook_hosts([HostRule("hooks.example.com", False, (8443,))])
    queued = await live_store.enqueue("default", "acme", {})
    await live_store.add_webhook(queued.run.id, "acme", url)
    (lease,) = await live_store.claim("default", "w", 1)
    await live_store.ack(lease, None)
    sender = WebhookSender(live_store, transport=httpx.MockTransport(answer))
    assert await sender.run_once() == 1
    (request,) = seen
    assert str(request.url) == sent_to
    assert request.headers["Host"] == url.split("/")[2]
    assert request.extensions.get("sni_hostname") == sni
    assert lookups == ["hooks.example.com"]
    found = await live_store.webhook(queued.run.id)
    assert found is not None
    assert found["state"] == "delivered"


async def finished(store: RunStore, tenant: str, url: str) -> Any:
    queued = await store.enqueue("default", tenant, {})
    await store.add_webhook(queued.run.id, tenant, url)
    (lease,) = await store.claim("default", "w", 1)
    await store.ack(lease, None)
    return queued.run.id


@pytest.mark.parametrize("port", [22, 5432, 6379, 10250])
async def test_a_port_the_admin_did_not_list_is_refused_at_submit(api: Api, port: int) -> None:
    """No port probing (issue 32): on an allowed host, any port could be
    tried and the answer read back through GET /v1/runs/{id}/webhook."""
    await allow(api, ("127.0.0.1", True, [8080]))
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        refused = await http.post("/v1/runs", json={
            "input": {}, "webhook_url": f"http://127.0.0.1:{port}/x"})
        listed = await http.post("/v1/runs", json={
            "input": {}, "webhook_url": "http://127.0.0.1:8080/x"})
        standard = await http.post("/v1/runs", json={
            "input": {}, "webhook_url": "https://127.0.0.1/x"})
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["field"] == "webhook_url"
    assert (listed.status_code, standard.status_code) == (201, 201)


async def test_a_port_unlisted_after_submit_is_not_called(live_store: RunStore) -> None:
    async with receiver() as hook:
        await live_store.set_webhook_hosts([HostRule("127.0.0.1", True, (hook.port,))])
        run_id = await finished(live_store, "acme", f"http://127.0.0.1:{hook.port}/hook")
        await live_store.set_webhook_hosts([HostRule("127.0.0.1", True)])
        assert await WebhookSender(live_store).run_once() == 1
        assert hook.received == []
    found = await live_store.webhook(run_id)
    assert found is not None
    assert (found["state"], found["attempts"][0]["error"]) == ("failed", "refused")


async def test_a_tenant_reads_the_class_of_a_failure_not_its_details(
    live_store: RunStore
) -> None:
    """What the tenant reads back says nothing of the network behind the
    host (no address, port, banner or errno)."""
    async with receiver() as hook:
        port = hook.port  # closed when the block ends: nothing listens there any more
    await live_store.set_webhook_hosts([HostRule("127.0.0.1", True, (port,))])
    run_id = await finished(live_store, "acme", f"http://127.0.0.1:{port}/hook")
    assert await WebhookSender(live_store).run_once() == 1
    found = await live_store.webhook(run_id)
    assert found is not None
    (attempt,) = found["attempts"]
    assert set(attempt) == {"try", "at", "error"}
    assert attempt["error"] == "connect"
    assert found["state"] == "waiting"  # retried later


async def test_a_tenant_has_at_most_its_bound_of_deliveries_taken(live_store: RunStore) -> None:
    await live_store.set_webhook_hosts([HostRule("127.0.0.1", True)])
    for tenant, n in (("acme", 6), ("globex", 2)):
        for _ in range(n):
            await finished(live_store, tenant, "http://127.0.0.1/hook")
    taken = await live_store.take_due_webhooks(batch=100, per_tenant=3,
                                               busy={"acme": 1})
    by_tenant = sorted(d.tenant_id for d in taken)
    assert by_tenant == ["acme", "acme", "globex", "globex"]
    full = await live_store.take_due_webhooks(batch=100, per_tenant=3,
                                              busy={"acme": 3, "globex": 3})
    assert full == []
    rest = await live_store.take_due_webhooks(batch=100, per_tenant=3)
    assert sorted(d.tenant_id for d in rest) == ["acme"] * 3


@pytest.mark.parametrize("ports", [[0], [65536], ["80"], [True], list(range(1000, 1017)),
                                   "8080", [8080.5], [None]])
async def test_bad_ports_in_the_allowlist_are_refused(api: Api, ports: Any) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        response = await http.put("/v1/webhook-hosts", json={
            "hosts": [{"host": "127.0.0.1", "allow_private": True, "ports": ports}]})
    assert response.status_code == 422, response.text
