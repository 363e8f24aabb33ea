"""The web console over HTTP: sessions, CSRF, tenant scope and escaping,
against a real API server and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from uuid import UUID

import httpx

from runlease.api.auth import ADMIN, Principal, TokenRegistry
from runlease.api.console.session import COOKIE, Sessions
from runlease.core.states import RunStatus
from runlease.db.models import Pool
from runlease.db.store import RunStore
from tests.support.api import ADMIN_TOKEN, CONSOLE_SECRET, Api

SECRET = CONSOLE_SECRET
HOSTILE = "<script>alert('pwned')</script>"


@asynccontextmanager
async def signed_in(api: Api, who: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url) as client:
        r = await client.post("/ui/login", data={"token": api.token(who)})
        assert r.status_code == 303, r.text
        assert r.headers["location"] == "/ui/runs"
        yield client


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


async def test_no_session_is_sent_to_sign_in(ui: Api) -> None:
    async with httpx.AsyncClient(base_url=ui.url) as client:
        for path in ("/ui/", "/ui/runs", "/ui/dead", "/ui/pools",
                     "/ui/runs/01900000-0000-7000-8000-000000000000"):
            r = await client.get(path)
            assert (r.status_code, r.headers.get("location")) == (303, "/ui/login"), path
        # A live fragment polled by htmx: a full-page redirect through HX-Redirect.
        r = await client.get("/ui/runs/table", headers={"HX-Request": "true"})
        assert (r.status_code, r.headers.get("hx-redirect")) == (401, "/ui/login")
        page = await client.get("/ui/login")
        assert page.status_code == 200
        assert 'name="token"' in page.text


async def test_sign_in_sets_a_guarded_cookie_and_sign_out_clears_it(ui: Api) -> None:
    async with httpx.AsyncClient(base_url=ui.url) as client:
        bad = await client.post("/ui/login", data={"token": "not-a-token-0123456789"})
        assert bad.status_code == 401
        assert "Unknown token" in bad.text
        assert COOKIE not in bad.cookies
        r = await client.post("/ui/login", data={"token": ui.token("acme")})
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}=")
        for attribute in ("HttpOnly", "SameSite=strict", "Path=/ui", "Max-Age="):
            assert attribute.lower() in cookie.lower(), cookie
        assert "secure" not in cookie.lower()  # plain http: a Secure cookie would be dropped
        assert ui.token("acme") not in cookie  # the token itself never leaves the server
        page = await client.get("/ui/runs")
        assert page.status_code == 200
        assert "acme" in page.text
        out = await client.post("/ui/logout", data={"csrf": csrf_of(page.text)})
        assert (out.status_code, out.headers["location"]) == (303, "/ui/login")
        assert 'max-age=0' in out.headers["set-cookie"].lower()
        assert (await client.get("/ui/runs")).status_code == 303


async def test_cookie_is_secure_over_https(ui: Api) -> None:
    # uvicorn trusts X-Forwarded-Proto from 127.0.0.1: the request is https.
    async with httpx.AsyncClient(base_url=ui.url) as client:
        r = await client.post("/ui/login", data={"token": ui.token("acme")},
                              headers={"X-Forwarded-Proto": "https"})
        assert r.status_code == 303
        assert "secure" in r.headers["set-cookie"].lower()


async def test_forged_or_expired_cookie_is_sent_to_sign_in(ui: Api) -> None:
    sessions = Sessions(SECRET, 3600)
    acme = sessions.token_id(TokenRegistry.digest_of(ui.token("acme")))
    good, _ = sessions.issue(Principal("acme"), acme)
    body, _, signature = good.partition(".")
    expired, _ = sessions.issue(Principal("acme"), acme, now=0)
    other = Sessions("another-secret-0123456789", 3600)
    other_key, _ = other.issue(ADMIN, other.token_id(TokenRegistry.digest_of(ADMIN_TOKEN)))
    # Signed right, but for a token the server no longer has (revoked), or
    # naming another principal than its token's.
    revoked, _ = sessions.issue(Principal("acme"), sessions.token_id("0" * 64))
    mismatched, _ = sessions.issue(ADMIN, acme)
    # A tenant's session turned into an admin's, keeping the signature.
    import base64
    raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    promoted = base64.urlsafe_b64encode(("*" + raw[len("acme"):]).encode()).decode().rstrip("=")
    for cookie in (f"{promoted}.{signature}", expired, other_key, "garbage", good + "x",
                   revoked, mismatched):
        async with httpx.AsyncClient(base_url=ui.url, cookies={COOKIE: cookie}) as client:
            r = await client.get("/ui/runs")
            assert (r.status_code, r.headers.get("location")) == (303, "/ui/login"), cookie
    async with httpx.AsyncClient(base_url=ui.url, cookies={COOKIE: good}) as client:
        assert (await client.get("/ui/runs")).status_code == 200


async def test_a_tenant_never_sees_another_tenants_run(ui: Api, live_store: RunStore) -> None:
    theirs = (await live_store.enqueue("default", "globex", {"secret": "globex-only"})).run
    mine = (await live_store.enqueue("default", "acme", {"task": "mine"})).run
    async with signed_in(ui, "acme") as client:
        assert (await client.get(f"/ui/runs/{theirs.id}")).status_code == 404
        assert (await client.get(f"/ui/runs/{theirs.id}/summary")).status_code == 404
        assert (await client.get(f"/ui/runs/{theirs.id}/stream-url")).status_code == 404
        listing = await client.get("/ui/runs")
        assert str(mine.id) in listing.text
        assert str(theirs.id) not in listing.text
        # Searching by its id finds nothing either; a tenant filter is ignored.
        found = await client.get("/ui/runs", params={"q": str(theirs.id), "tenant": "globex"})
        assert f'data-run="{theirs.id}"' not in found.text
        assert "No run matches" in found.text
        page = await client.get(f"/ui/runs/{mine.id}")
        cancel = await client.post(f"/ui/runs/{theirs.id}/cancel",
                                   data={"csrf": csrf_of(page.text)})
        assert cancel.status_code == 404
    assert (await live_store.get(theirs.id)).status == RunStatus.PENDING
    async with signed_in(ui, "admin") as admin:
        both = await admin.get("/ui/runs")
        assert str(mine.id) in both.text
        assert str(theirs.id) in both.text
        only = await admin.get("/ui/runs", params={"tenant": "globex"})
        assert str(theirs.id) in only.text
        assert str(mine.id) not in only.text
        assert (await admin.get(f"/ui/runs/{theirs.id}")).status_code == 200


async def test_a_post_without_a_valid_csrf_token_is_refused(ui: Api,
                                                           live_store: RunStore) -> None:
    run = (await live_store.enqueue("default", "acme", {"task": "x"})).run
    async with signed_in(ui, "acme") as client:
        page = await client.get(f"/ui/runs/{run.id}")
        token = csrf_of(page.text)
        url = f"/ui/runs/{run.id}/cancel"
        assert (await client.post(url, data={})).status_code == 403
        assert (await client.post(url, data={"csrf": token[:-2] + "xx"})).status_code == 403
        assert (await client.post("/ui/logout", data={})).status_code == 403
        # The right token from another site's page: refused by its Origin.
        evil = await client.post(url, data={"csrf": token},
                                 headers={"Origin": "https://evil.example"})
        assert evil.status_code == 403
        assert (await live_store.get(run.id)).status == RunStatus.PENDING
        ok = await client.post(url, data={"csrf": token})
        assert (ok.status_code, ok.headers["location"]) == (
            303, f"/ui/runs/{run.id}?notice=cancel")
    assert (await live_store.get(run.id)).status == RunStatus.CANCELLED
    # Another session's token is not this session's.
    async with signed_in(ui, "acme") as other:
        run2 = (await live_store.enqueue("default", "acme", {"task": "y"})).run
        r = await other.post(f"/ui/runs/{run2.id}/cancel", data={"csrf": token})
        assert r.status_code == 403


async def dead_run(store: RunStore, tenant: str, message: str, code: str = "boom") -> UUID:
    await store.upsert_pool(Pool("graveyard"))  # its own pool: the claim takes this run
    run = (await store.enqueue("graveyard", tenant, {"task": "dies"})).run
    (lease,) = await store.claim("graveyard", "test-worker")
    assert lease.run_id == run.id
    await store.fail(lease, code, message)
    return run.id


async def test_hostile_input_and_error_are_escaped(ui: Api, live_store: RunStore) -> None:
    run = (await live_store.enqueue("default", "acme", {"prompt": HOSTILE, HOSTILE: 1},
                                    idempotency_key="<svg/onload=alert(1)>")).run
    dead = await dead_run(live_store, "acme", f"tool said {HOSTILE} <b>bad</b>")
    async with signed_in(ui, "acme") as client:
        pages = [await client.get("/ui/runs"), await client.get(f"/ui/runs/{run.id}"),
                 await client.get(f"/ui/runs/{dead}"),
                 await client.get("/ui/runs", params={"q": "<svg/onload=alert(1)>"}),
                 await client.get("/ui/runs", params={"pool": "<script>"})]
    for page in pages:
        assert "<script>alert" not in page.text
        assert "<svg/onload" not in page.text
        assert "<b>bad</b>" not in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "&lt;script&gt;alert(" in pages[1].text
    assert "&lt;svg/onload=alert(1)&gt;" in pages[0].text
    assert "&lt;svg/onload=alert(1)&gt;" in pages[3].text  # found by its key
    assert "tool said &lt;script&gt;" in pages[2].text
    assert "&lt;b&gt;bad&lt;/b&gt;" in pages[2].text
    assert pages[4].status_code == 400  # a pool name that is not one: shown, escaped


async def test_redrive_is_for_admins_and_redrives_many(ui: Api, live_store: RunStore) -> None:
    first = await dead_run(live_store, "acme", "one")
    second = await dead_run(live_store, "globex", "two")
    async with signed_in(ui, "acme") as tenant:
        page = await tenant.get(f"/ui/runs/{first}")
        assert "redrive-run" not in page.text
        r = await tenant.post(f"/ui/runs/{first}/redrive", data={"csrf": csrf_of(page.text)})
        assert r.status_code == 403
        assert (await tenant.get("/ui/dead")).status_code == 403
    assert (await live_store.get(first)).status == RunStatus.DEAD
    async with signed_in(ui, "admin") as admin:
        dead = await admin.get("/ui/dead")
        assert str(first) in dead.text
        assert str(second) in dead.text
        r = await admin.post("/ui/dead/redrive",
                             data={"csrf": csrf_of(dead.text), "id": [str(first), str(second)]})
        assert (r.status_code, r.headers["location"]) == (303, "/ui/dead?redriven=2&skipped=0")
        again = await admin.post("/ui/dead/redrive",
                                 data={"csrf": csrf_of(dead.text), "id": [str(first)]})
        assert again.headers["location"] == "/ui/dead?redriven=0&skipped=1"
        assert "No dead letters" in (await admin.get("/ui/dead")).text
    for run_id in (first, second):
        assert (await live_store.get(run_id)).status == RunStatus.PENDING


async def test_pools_page_pauses_and_sets_limits(ui: Api, live_store: RunStore) -> None:
    await live_store.enqueue("default", "acme", {"task": "waits"})
    async with signed_in(ui, "admin") as admin:
        page = await admin.get("/ui/pools")
        assert page.status_code == 200
        assert "Lease expiries, last hour" in page.text
        token = csrf_of(page.text)
        r = await admin.post("/ui/pools/default/paused", data={"csrf": token, "paused": "true"})
        assert r.status_code == 303
        assert (await live_store.get_pool("default")).paused  # type: ignore[union-attr]
        r = await admin.post("/ui/pools/default/limit",
                             data={"csrf": token, "tenant": "acme", "max_in_flight": "3"})
        assert r.status_code == 303
        assert await live_store.tenant_limits("default") == {"acme": 3}
        bad = await admin.post("/ui/pools/default/limit",
                               data={"csrf": token, "tenant": "acme", "max_in_flight": "-1"})
        assert bad.status_code == 400
        assert "1 / 3" not in (await admin.get("/ui/pools")).text  # nothing leased yet
        assert "0 / 3" in (await admin.get("/ui/pools")).text
        assert (await admin.get("/ui/workers")).status_code == 200
        live = await admin.get("/ui/pools/default/stats", headers={"HX-Request": "true"})
        assert live.status_code == 200
        assert "0 / 3" in live.text
        assert 'hx-trigger="every 5s"' in live.text
        assert (await admin.get("/ui/pools/nowhere/stats")).status_code == 400
    async with signed_in(ui, "acme") as tenant:
        assert (await tenant.get("/ui/pools")).status_code == 403
        assert (await tenant.get("/ui/pools/default/stats")).status_code == 403


async def test_static_files_come_from_the_package(ui: Api) -> None:
    async with httpx.AsyncClient(base_url=ui.url) as client:
        htmx = await client.get("/ui/static/htmx.min.js")
        assert htmx.status_code == 200
        assert htmx.text.startswith("/*! htmx.org")
        assert (await client.get("/ui/static/console.js")).status_code == 200
        assert (await client.get("/ui/static/console.css")).status_code == 200


async def test_status_counts_are_scoped(live_store: RunStore) -> None:
    for _ in range(3):
        await live_store.enqueue("default", "acme", {"task": "a"})
    await live_store.enqueue("default", "globex", {"task": "g"})
    acme = await live_store.status_counts(tenant_id="acme")
    assert (acme.by_status, acme.total) == ({"pending": 3}, 3)
    everyone = await live_store.status_counts()
    assert everyone.by_status == {"pending": 4}
    assert (await live_store.status_counts(pool="elsewhere")).by_status == {}


async def test_label_and_created_filters(ui: Api, live_store: RunStore) -> None:
    tagged = (await live_store.enqueue("default", "acme", {"t": 1},
                                       labels={"team": "search", "note": HOSTILE})).run
    other = (await live_store.enqueue("default", "acme", {"t": 2},
                                      labels={"team": "ads"})).run
    theirs = (await live_store.enqueue("default", "globex", {"t": 3},
                                       labels={"team": "search"})).run
    async with signed_in(ui, "acme") as client:
        page = await client.get("/ui/runs", params={"label": "team:search"})
        assert f'data-run="{tagged.id}"' in page.text
        assert f'data-run="{other.id}"' not in page.text
        assert f'data-run="{theirs.id}"' not in page.text  # another tenant's: never
        assert "<script>alert" not in page.text  # a hostile label value is text
        assert "note:&lt;script&gt;" in page.text
        # Created range, in the viewer's zone (tz: minutes behind UTC, as JS gives it).
        created = tagged.created_at
        local = (created - timedelta(minutes=-120)).replace(tzinfo=None)  # UTC+2
        window = {"created_after": (local - timedelta(minutes=1)).isoformat(timespec="minutes"),
                  "created_before": (local + timedelta(minutes=2)).isoformat(timespec="minutes"),
                  "tz": "-120"}
        inside = await client.get("/ui/runs", params=window)
        assert f'data-run="{tagged.id}"' in inside.text
        earlier = {"created_before": (local - timedelta(minutes=5)).isoformat(timespec="minutes"),
                   "tz": "-120"}
        assert f'data-run="{tagged.id}"' not in (await client.get("/ui/runs",
                                                               params=earlier)).text
        bad = await client.get("/ui/runs", params={"label": "no-colon"})
        assert bad.status_code == 400
        assert "key=value" in bad.text
        live = await client.get("/ui/runs/table", params={"label": "team:search"})
        assert "label=team%3Asearch" in live.text  # the poll keeps the filter
    run_page_text = ""
    async with signed_in(ui, "acme") as client:
        run_page_text = (await client.get(f"/ui/runs/{tagged.id}")).text
    assert "team:search" in run_page_text
