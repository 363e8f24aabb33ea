"""A list page rendered by PostgreSQL (db/run_json.py) is the JSON the API's
Python rendering makes of the same runs (api/schemas.run_page_json): the
same members in the same order, equal values, for runs in every state, for
a tenant and for an admin."""

from __future__ import annotations

import json
from dataclasses import fields
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from runlease.api.schemas import RunOut, run_page_json
from runlease.core.backoff import RetryPolicy
from runlease.db.run_search import RunFilter
from runlease.db.store import RunStore

HOSTILE = "é\u2028\"\\ </script>\x01\t\n😀"


async def made(store: RunStore, db_url: str) -> None:
    """Runs of acme in every state, with every optional field set on some."""
    plain = await store.enqueue("default", "acme", {"q": HOSTILE, "n": [1, 2.5, None, 1e-7],
                                                    "deep": {"z": 1, "a": {"b": []}}})
    labelled = await store.enqueue(
        "default", "acme", {}, labels={"team": "search", "env": HOSTILE[:5]},
        idempotency_key="k-1", budget={"max_turns": 4, "deadline_s": 1.5},
        retry=RetryPolicy.checked(7, 90, ["invalid_input", "quota"]), max_attempts=4)
    leases = {lease.run_id: lease for lease in await store.claim("default", "w-1", 10)}
    await store.ack(leases.pop(plain.run.id), [{"x": 1}, "two", 3.25, None, True])
    await store.fail(leases.pop(labelled.run.id), "agent_error", HOSTILE)
    for result in (None, 0, "text", {"nested": {"k": [1.0, -0.0]}}):
        run = await store.enqueue("default", "acme", {"result": repr(result)})
        (lease,) = await store.claim("default", "w-2", 1)
        assert lease.run_id == run.run.id
        await store.ack(lease, result)
    cancelled = await store.enqueue("default", "acme", {"c": 1})
    await store.request_cancel(cancelled.run.id)
    leased = await store.enqueue("default", "acme", {"l": 1}, priority=-3)
    await store.claim("default", "w-3", 1)
    parent = await store.enqueue("default", "acme", {"parent": True})
    child = await store.enqueue("default", "acme", {"child": True})
    await store.enqueue("default", "globex", {"theirs": True})
    with psycopg.connect(db_url, autocommit=True) as conn:
        # What only workers and the leader set: usage, parentage, and a
        # whole second (no microseconds), in the runs' own columns.
        for run_id, cost in ((leased.run.id, Decimal("0.0042")), (child.run.id, Decimal(2)),
                             (parent.run.id, Decimal("12345678.123456789"))):
            conn.execute("UPDATE agent_runs SET cost = %s, input_tokens = 1520, "
                         "output_tokens = 310, turns_used = 3, tool_calls_used = 2 "
                         "WHERE id = %s", (cost, run_id))
        conn.execute("UPDATE agent_runs SET parent_run_id = %s, awaiting_children = true, "
                     "created_at = date_trunc('second', created_at) WHERE id = %s",
                     (parent.run.id, child.run.id))


def python_page(runs: list[Any], limit: int, admin: bool) -> Any:
    return json.loads(run_page_json(runs, limit, admin=admin))


@pytest.mark.parametrize("admin", [False, True], ids=["tenant", "admin"])
async def test_the_page_sql_renders_is_the_page_python_renders(
        store: RunStore, db_url: str, admin: bool) -> None:
    await made(store, db_url)
    f = RunFilter(tenant_id=None if admin else "acme")
    for limit in (3, 50):
        runs = await store.search(f, limit=limit)
        text = await store.search_page(f, admin=admin, limit=limit)
        page = json.loads(text)
        assert page == python_page(runs, limit, admin)
        for ours, theirs in zip(page["items"], python_page(runs, limit, admin)["items"],
                                strict=True):
            assert list(ours) == [f.name for f in fields(RunOut)] == list(theirs)
            assert type(ours["usage"]["cost"]) is float
        if limit == 3:
            assert page["next_cursor"] == str(runs[-1].id)
            nxt = await store.search(f, limit=limit, before=runs[-1].id)
            assert json.loads(await store.search_page(f, admin=admin, limit=limit,
                                                      before=runs[-1].id)) == \
                python_page(nxt, limit, admin)
        else:
            assert page["next_cursor"] is None
    everything = json.loads(await store.search_page(RunFilter(), admin=admin, limit=50))
    leases = [item["lease"] for item in everything["items"] if item["status"] == "leased"]
    assert leases
    assert all((lease is not None) == admin for lease in leases)
    assert {item["tenant_id"] for item in page["items"]} == (
        {"acme", "globex"} if admin else {"acme"})


async def test_an_empty_page(store: RunStore) -> None:
    assert json.loads(await store.search_page(RunFilter(tenant_id="acme"), admin=False)) == {
        "items": [], "next_cursor": None}
