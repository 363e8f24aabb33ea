"""Labels and search: GET /v1/runs filters, tenant scoping, cursor pages, and
the index each filter starts from (EXPLAIN over enough rows that a missing
index would show as a sequential scan)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from runlease.client import AsyncClient, Client
from runlease.core.states import RunStatus
from runlease.db.run_search import RunFilter, select_runs
from runlease.db.store import RunStore
from tests.support.api import Api


async def submit(http: httpx.AsyncClient, body: dict[str, Any], key: str | None = None,
                 ) -> dict[str, Any]:
    headers = {"Idempotency-Key": key} if key else {}
    r = await http.post("/v1/runs", json=body, headers=headers)
    assert r.status_code in (200, 201), r.text
    return r.json()  # type: ignore[no-any-return]


async def ids(http: httpx.AsyncClient, **params: Any) -> list[str]:
    r = await http.get("/v1/runs", params=params)
    assert r.status_code == 200, r.text
    return [item["id"] for item in r.json()["items"]]


async def test_labels_are_shown_and_filter_runs(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("globex")) as globex:
        a = await submit(acme, {"input": {}, "labels": {"team": "search", "env": "prod"}})
        b = await submit(acme, {"input": {}, "labels": {"team": "search", "env": "dev"}})
        c = await submit(acme, {"input": {}, "labels": {"team": "ads"}})
        g = await submit(globex, {"input": {}, "labels": {"team": "search"}})
        assert a["labels"] == {"team": "search", "env": "prod"}
        assert (await acme.get(f"/v1/runs/{c['id']}")).json()["labels"] == {"team": "ads"}

        assert await ids(acme, label="team:search") == [b["id"], a["id"]]
        assert await ids(acme, label=["team:search", "env:prod"]) == [a["id"]]
        assert await ids(acme, label=["team:search", "team:ads"]) == []
        assert await ids(acme, label="team:nobody") == []
        assert await ids(globex, label="team:search") == [g["id"]]
        assert await ids(acme) == [c["id"], b["id"], a["id"]]


async def test_several_labels_find_the_runs_with_all_of_them(api: Api) -> None:
    """Each label after the first is joined from its own index range: the
    runs with every label, newest first, paged, the tenant's own only."""
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("globex")) as globex, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as admin:
        both = [await submit(acme, {"input": {"i": i}, "labels": {"team": "a", "env": "prod",
                                                                   "case": str(i % 2)}})
                for i in range(5)]
        await submit(acme, {"input": {}, "labels": {"team": "a", "env": "dev"}})
        await submit(acme, {"input": {}, "labels": {"env": "prod"}})
        theirs = await submit(globex, {"input": {}, "labels": {"team": "a", "env": "prod"}})
        newest_first = [r["id"] for r in reversed(both)]

        assert await ids(acme, label=["team:a", "env:prod"]) == newest_first
        assert await ids(acme, label=["env:prod", "team:a"]) == newest_first
        assert await ids(acme, label=["team:a", "env:prod", "case:1"]) == [
            both[3]["id"], both[1]["id"]]
        assert await ids(acme, label=["team:a", "env:prod"], status="done") == []
        assert await ids(acme, label=["team:a", "case:9"]) == []
        assert await ids(globex, label=["team:a", "env:prod"]) == [theirs["id"]]
        assert await ids(admin, label=["team:a", "env:prod"]) == [theirs["id"], *newest_first]
        assert await ids(admin, tenant="globex", label=["team:a", "env:prod"]) == [theirs["id"]]
        first = (await acme.get("/v1/runs", params={"label": ["team:a", "env:prod"],
                                                    "limit": 3})).json()
        rest = await ids(acme, label=["team:a", "env:prod"], cursor=first["next_cursor"])
        assert [r["id"] for r in first["items"]] + rest == newest_first


async def test_finished_filters_read_past_a_backlog(api: Api, live_store: RunStore) -> None:
    """Finished runs older than a tenant's pending backlog, by status or
    finish time, the tenant's own only (agent_runs_finished_tenant_idx)."""
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("globex")) as globex:
        finished = [await submit(acme, {"input": {"i": i}}) for i in range(4)]
        other = await submit(globex, {"input": {}})
        assert (await acme.post(f"/v1/runs/{finished[1]['id']}/cancel")).status_code == 202
        leases = await live_store.claim("default", "w", 10)
        assert {str(lease.run_id) for lease in leases} == {
            r["id"] for r in [finished[0], finished[2], finished[3], other]}
        for lease in leases:
            await live_store.ack(lease, {"ok": True})
        backlog = [await submit(acme, {"input": {"later": i}}) for i in range(3)]

        done = [finished[3]["id"], finished[2]["id"], finished[0]["id"]]
        assert await ids(acme, status="done") == done
        assert await ids(acme, status=["done", "cancelled"]) == [
            finished[3]["id"], finished[2]["id"], finished[1]["id"], finished[0]["id"]]
        assert await ids(acme, status="done", pool="default", limit=2) == done[:2]
        page = (await acme.get("/v1/runs", params={"status": "done", "limit": 2})).json()
        assert await ids(acme, status="done", cursor=page["next_cursor"]) == done[2:]
        later = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
        assert len(await ids(acme, finished_before=later)) == 4
        assert await ids(acme, status=["done", "pending"]) == [
            *(r["id"] for r in reversed(backlog)), *done]
        assert await ids(globex, status="done") == [other["id"]]


async def test_status_pool_time_and_key_filters(api: Api, live_store: RunStore) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        await live_store.upsert_pool(__import__("runlease.db.models",
                                                fromlist=["Pool"]).Pool("other"))
        first = await submit(acme, {"input": {"n": 1}}, key="k-1")
        middle = datetime.now(UTC)
        second = await submit(acme, {"input": {"n": 2}, "pool": "other"}, key="k-1")
        third = await submit(acme, {"input": {"n": 3}})
        await acme.post(f"/v1/runs/{third['id']}/cancel")

        assert await ids(acme, status="cancelled") == [third["id"]]
        assert await ids(acme, status=["pending", "cancelled"]) == [
            third["id"], second["id"], first["id"]]
        assert await ids(acme, pool="other") == [second["id"]]
        assert await ids(acme, created_after=middle.isoformat()) == [third["id"], second["id"]]
        assert await ids(acme, created_before=middle.isoformat()) == [first["id"]]
        assert await ids(acme, finished_after=middle.isoformat()) == [third["id"]]
        later = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
        assert await ids(acme, finished_before=later) == [third["id"]]
        assert await ids(acme, finished_before=middle.isoformat()) == []
        assert await ids(acme, idempotency_key="k-1") == [second["id"], first["id"]]
        assert await ids(acme, idempotency_key="k-1", pool="default") == [first["id"]]


async def test_a_tenant_never_finds_another_tenants_runs(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("globex")) as globex, \
            httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as admin:
        theirs = await submit(globex, {"input": {}, "labels": {"team": "x' OR '1'='1"}},
                              key="shared-key")
        mine = await submit(acme, {"input": {}, "labels": {"team": "search"}})
        hostile = [{"label": "team:x' OR '1'='1"}, {"label": "team:%"},
                   {"idempotency_key": "shared-key"}, {"tenant": "acme"},
                   {"label": "team:search", "status": "pending"},
                   {"created_after": "1970-01-01T00:00:00Z"}]
        for params in hostile:
            found = await ids(acme, **params)
            assert theirs["id"] not in found, params
        assert (await acme.get("/v1/runs", params={"tenant": "globex"})).status_code == 403
        # Admins see across tenants, or one tenant.
        assert await ids(admin, tenant="globex") == [theirs["id"]]
        assert set(await ids(admin, label="team:search")) == {mine["id"]}
        assert await ids(admin, tenant="globex", idempotency_key="shared-key") == [theirs["id"]]
        assert (await admin.get("/v1/runs", params={"idempotency_key": "k"})).status_code == 403


@pytest.mark.parametrize(("params", "field"), [
    ({"label": "no-colon"}, "label"),
    ({"label": "-bad-key:v"}, "label"),
    ({"label": "k:\x01"}, "label"),
    ({"label": "k:" + "v" * 300}, "label"),
    ({"status": "running"}, "status"),
    ({"created_after": "yesterday"}, "created_after"),
    ({"created_after": "2026-01-01T00:00:00"}, "created_after"),  # no offset
    ({"limit": "0"}, "limit"),
    ({"limit": "501"}, "limit"),
    ({"cursor": "not-a-uuid"}, "cursor"),
    ({"pool": "Not_A_Pool"}, "pool"),
])
async def test_bad_filters_are_422_naming_the_parameter(api: Api, params: dict[str, str],
                                                        field: str) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        r = await acme.get("/v1/runs", params=params)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field


@pytest.mark.parametrize("labels", [
    {f"k{i}": "v" for i in range(17)}, {"": "v"}, {"a" * 64: "v"}, {"k": "v" * 257},
    {"k": 1}, {"k": "\x00"}, {"bad key": "v"}, ["k", "v"],
])
async def test_bad_labels_are_refused(api: Api, labels: Any) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as acme:
        r = await acme.post("/v1/runs", json={"input": {}, "labels": labels})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"].startswith("labels")


async def test_cursor_pages_are_stable_under_inserts(api: Api) -> None:
    async with AsyncClient(api.url, api.token("acme")) as client:
        made = [(await client.submit({"i": i}, labels={"batch": "one"})).id for i in range(7)]
        seen = []
        page = await client.list(limit=3, label=["batch:one"])
        seen += [r.id for r in page.items]
        while page.next_cursor:
            await client.submit({"late": True}, labels={"batch": "one"})  # newer: never shown
            page = await client.list(limit=3, label=["batch:one"], cursor=page.next_cursor)
            seen += [r.id for r in page.items]
        assert seen == list(reversed(made))


async def test_sync_client_filters(api: Api) -> None:
    def use() -> None:
        with Client(api.url, api.token("acme")) as client:
            run = client.submit({"x": 1}, labels={"team": "sync"})
            assert run.labels == {"team": "sync"}
            page = client.list(status=["pending"], label={"team": "sync"},
                               created_after=run.created_at - timedelta(seconds=1))
            assert [r.id for r in page.items] == [run.id]
            assert client.list(status="done", label=["team:sync"]).items == []

    await asyncio.to_thread(use)


# -- plans ---------------------------------------------------------------------------------

SEARCHED = ("agent_runs", "agent_run_tenant_index", "agent_run_labels")
N_RUNS = 60_000


@pytest.fixture(scope="module")
def many_runs(server_url: str, template_db: str) -> Any:
    """A database with N_RUNS runs of 20 tenants, labelled, mostly finished."""
    from tests.support.databases import _create_db, _drop_db, with_dbname

    name = _create_db(server_url, template_db)
    url = with_dbname(server_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            WITH made AS (
                SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - {N_RUNS} + g),
                             12, '0') || '7000' || '8000' || lpad(to_hex(g), 12, '0'))::uuid AS id,
                       'tenant-' || (g % 20) AS tenant_id, g
                  FROM generate_series(1, {N_RUNS}) g
            ), ins AS (
                INSERT INTO agent_runs (id, tenant_id, status, input_json, finished_at, labels,
                                        idempotency_key, created_at)
                SELECT id, tenant_id, CASE WHEN g % 100 = 0 THEN 'pending' ELSE 'done' END,
                       '{{}}', CASE WHEN g % 100 = 0 THEN NULL ELSE now() END,
                       jsonb_build_object('team', 'team-' || (g % 50), 'case', g::text),
                       'key-' || g, now() - make_interval(secs => {N_RUNS} - g)
                  FROM made
                RETURNING id, tenant_id, labels
            ), t AS (
                INSERT INTO agent_run_tenant_index SELECT tenant_id, id FROM ins
            )
            INSERT INTO agent_run_labels
            SELECT ins.tenant_id, l.key, l.value, ins.id
              FROM ins CROSS JOIN LATERAL jsonb_each_text(ins.labels) l""")
        conn.execute("ANALYZE")
    yield url
    _drop_db(server_url, name)


def generic(query: sql.Composed, params: dict[str, Any]) -> sql.Composed:
    """EXPLAIN (GENERIC_PLAN) of the statement, its parameters as $1, $2...:
    the plan the API's connections keep (plan_cache_mode=force_generic_plan)."""
    text = query.as_string(None)
    for i, name in enumerate(params, start=1):
        text = text.replace(f"%({name})s", f"${i}")
    return sql.Composed([sql.SQL("EXPLAIN (GENERIC_PLAN, FORMAT JSON) "), sql.SQL(text)])  # type: ignore[arg-type]


def scanned(url: str, f: RunFilter, *, generic_plan: bool = False,
            **kw: Any) -> list[tuple[str, str]]:
    """(node type, relation) of every scan in the plan of f's statement."""
    return [(node, relation) for node, relation, _ in
            plan_scans(url, f, generic_plan=generic_plan, **kw)]


def plan_scans(url: str, f: RunFilter, *, generic_plan: bool = False,
               **kw: Any) -> list[tuple[str, str, str]]:
    """(node type, relation, index or "") of every scan in the plan."""
    query, params = select_runs(f.validated(), limit=50, **kw)
    with psycopg.connect(url) as conn:
        explain = (generic(query, params) if generic_plan
                   else sql.SQL("EXPLAIN (FORMAT JSON) ") + query)
        text = conn.execute(explain, None if generic_plan else params).fetchone()[0]  # type: ignore[index]
    plan = text if isinstance(text, list) else json.loads(text)
    found: list[tuple[str, str, str]] = []

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node:
            found.append((node["Node Type"], node["Relation Name"], node.get("Index Name", "")))
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan[0]["Plan"])
    return found


T = "tenant-7"
AT = datetime.now(UTC) - timedelta(seconds=N_RUNS // 2)
FILTERS = {
    "tenant": RunFilter(tenant_id=T),
    "status": RunFilter(tenant_id=T, statuses=(RunStatus.PENDING, RunStatus.LEASED)),
    "dead": RunFilter(tenant_id=T, statuses=(RunStatus.DEAD,)),
    "done": RunFilter(tenant_id=T, statuses=(RunStatus.DONE,), pool="default"),
    "finished": RunFilter(tenant_id=T, statuses=(RunStatus.DONE, RunStatus.CANCELLED)),
    "pool": RunFilter(tenant_id=T, pool="default"),
    "label": RunFilter(tenant_id=T, labels=(("team", "team-7"),)),
    "labels": RunFilter(tenant_id=T, labels=(("team", "team-7"), ("case", "107"))),
    "created_after": RunFilter(tenant_id=T, created_after=AT),
    "created_before": RunFilter(tenant_id=T, created_before=AT),
    "finished_after": RunFilter(tenant_id=T, finished_after=AT),
    "finished_before": RunFilter(tenant_id=T, finished_before=AT),
    "idempotency_key": RunFilter(tenant_id=T, idempotency_key="key-107"),
    "admin": RunFilter(),
    "admin_status": RunFilter(statuses=(RunStatus.DEAD,)),
    "admin_label": RunFilter(labels=(("team", "team-7"),)),
    "admin_labels": RunFilter(labels=(("team", "team-7"), ("case", "107"))),
    "admin_created": RunFilter(created_after=AT, created_before=AT + timedelta(hours=1)),
}


@pytest.mark.parametrize("generic_plan", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("name", list(FILTERS))
def test_each_filter_is_an_index_scan(many_runs: str, name: str, generic_plan: bool) -> None:
    scans = scanned(many_runs, FILTERS[name], generic_plan=generic_plan)
    assert scans, scans
    assert not [s for s in scans if s[0] == "Seq Scan" and s[1] in SEARCHED], scans
    # And with a cursor (the next page) too.
    cursor = __import__("uuid").UUID(int=(1 << 127) - 1)
    scans = scanned(many_runs, FILTERS[name], before=cursor, generic_plan=generic_plan)
    assert not [s for s in scans if s[0] == "Seq Scan" and s[1] in SEARCHED], scans


@pytest.mark.parametrize("name", ["done", "finished_after"])
def test_finished_filters_start_from_the_tenants_finished_runs(many_runs: str,
                                                               name: str) -> None:
    """Not the tenant's line in agent_run_tenant_index, whose newest runs may
    be a backlog of pending ones read before the first match: the tenant's
    finished runs (or, for a tenant with a large share of the table, as here
    where a tenant is one run in 20, the primary key: the planner's choice)."""
    for generic_plan in (False, True):
        # Beside the lease's expiry, looked up in the (small) workers
        # registry for each leased run of the page.
        scans = [s for s in plan_scans(many_runs, FILTERS[name], generic_plan=generic_plan)
                 if s[1] != "agent_run_workers"]
        assert len(scans) == 1, scans
        assert scans[0][1:] in {("agent_runs", "agent_runs_finished_tenant_idx"),
                                ("agent_runs", "agent_runs_pkey")}, scans
    # A tenant the statistics show few runs of (as most of 200): its finished runs.
    scans = plan_scans(many_runs, RunFilter(tenant_id="tenant-new", statuses=(RunStatus.DONE,)),
                       generic_plan=False)
    assert ("Index Scan", "agent_runs", "agent_runs_finished_tenant_idx") in scans, scans


def test_several_labels_are_found_in_the_label_index(many_runs: str) -> None:
    """Every label is looked up in the side table's indexes, none checked in
    the runs' labels column (which reads every run of the first label)."""
    for generic_plan in (False, True):
        for f in (FILTERS["labels"], FILTERS["admin_labels"]):
            scans = plan_scans(many_runs, f, generic_plan=generic_plan)
            labels = [s for s in scans if s[1] == "agent_run_labels"]
            assert len(labels) == 2, scans
            assert all(s[0] in ("Index Only Scan", "Index Scan", "Bitmap Heap Scan")
                       for s in labels), scans
            query, _ = select_runs(f, limit=50)
            assert "r.labels" not in query.as_string(None)


async def test_the_rarest_label_is_read_first(live_store: RunStore) -> None:
    """label_counts orders the labels, whatever order they are given in; a
    label no run has answers an empty page without the search."""
    for i in range(6):
        await live_store.enqueue("default", "acme", {"i": i},
                                 labels={"team": "a", **({"case": "rare"} if i == 2 else {})})
    await live_store.enqueue("default", "globex", {}, labels={"case": "rare"})
    for labels in ((("team", "a"), ("case", "rare")), (("case", "rare"), ("team", "a"))):
        f = RunFilter(tenant_id="acme", labels=labels)
        async with live_store.connection() as conn:
            ordered = await live_store._rarest_label_first(f, conn)
        assert ordered is not None
        assert ordered.labels == (("case", "rare"), ("team", "a"))
        found = await live_store.search(f)
        assert [r.input_json for r in found] == [{"i": 2}]
        assert json.loads(await live_store.search_page(f, admin=False))["items"][0]["id"] == \
            str(found[0].id)
    none = RunFilter(tenant_id="acme", labels=(("team", "a"), ("case", "nobody")))
    assert await live_store.search(none) == []
    assert json.loads(await live_store.search_page(none, admin=True)) == {
        "items": [], "next_cursor": None}


def test_without_the_label_index_the_label_filter_would_scan(many_runs: str) -> None:
    """The plan test can fail: drop the side table's key and the plan changes."""
    query, params = select_runs(FILTERS["label"], limit=50)
    with psycopg.connect(many_runs) as conn:
        conn.execute("ALTER TABLE agent_run_labels DROP CONSTRAINT agent_run_labels_pkey")
        conn.execute("DROP INDEX agent_run_labels_any_tenant_idx")
        text = conn.execute(sql.SQL("EXPLAIN ") + query, params).fetchall()
        conn.rollback()
    assert "Seq Scan on agent_run_labels" in "\n".join(r[0] for r in text)


async def test_retention_deletes_a_runs_labels_with_it(store: RunStore, clock: Any,
                                                       db_url: str) -> None:
    kept = await store.enqueue("default", "acme", {}, labels={"team": "a"})
    gone = await store.enqueue("default", "acme", {}, labels={"team": "a", "x": "y"})
    await store.request_cancel(gone.run.id)
    clock.advance(60)
    assert await store.delete_finished(30) == 1
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT run_id FROM agent_run_labels").fetchall()
    assert rows == [(kept.run.id,)]
    assert [r.id for r in await store.search(RunFilter(tenant_id="acme",
                                                       labels=(("team", "a"),)))] == [kept.run.id]
