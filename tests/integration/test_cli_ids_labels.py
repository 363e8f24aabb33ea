"""A run named by the start of its id (at least 8 hex digits) wherever the
CLI takes an id, and in the console's search; labels as `key=value`
(kubectl's selectors) wherever a label filter is taken, `key:value` too."""

from __future__ import annotations

import asyncio
import json
from uuid import UUID

import httpx
from click.testing import CliRunner, Result

from runlease.cli import main as cli
from runlease.db.store import NewRun, RunStore
from tests.support.api import Api


async def invoke(api: Api, who: str, *args: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke, cli, [*args, "--api-url", api.url, "--token", api.token(who)])


def unique_prefix(run_id: UUID, others: list[UUID]) -> str:
    text = str(run_id)
    for n in range(9, 37):
        if not any(str(o).startswith(text[:n]) for o in others if o != run_id):
            return text[:n]
    raise AssertionError("no unique prefix")


async def test_a_unique_id_prefix_is_taken_wherever_an_id_is(api: Api,
                                                           live_store: RunStore) -> None:
    ids = [e.run.id for e in await live_store.enqueue_many(
        "default", [NewRun("acme", {}) for _ in range(3)])]
    other = (await live_store.enqueue("default", "globex", {})).run.id
    everyone = [*ids, other]
    short = unique_prefix(ids[0], everyone)
    shown = await invoke(api, "acme", "runs", "show", short, "-o", "json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["id"] == str(ids[0])
    steps = await invoke(api, "acme", "runs", "steps", short)
    assert steps.exit_code == 0, steps.output
    moved = await invoke(api, "acme", "runs", "reprioritize", short, "--priority", "5")
    assert moved.exit_code == 0, moved.output
    cancelled = await invoke(api, "acme", "runs", "cancel", short)
    assert cancelled.exit_code == 0, cancelled.output
    assert f"{ids[0]}: cancelled" in cancelled.output
    # Runs minted together share their first digits (UUIDv7: the time first).
    common = str(ids[1])[:8]
    if str(ids[2]).startswith(common):
        several = await invoke(api, "acme", "runs", "show", common)
        assert several.exit_code == 1
        assert "several runs" in several.output
    too_short = await invoke(api, "acme", "runs", "show", str(ids[1])[:7])
    assert too_short.exit_code == 2
    assert "first 8 hex digits" in too_short.output
    # Hostile: another tenant's id prefix finds nothing (as a missing run).
    theirs = await invoke(api, "acme", "runs", "show", unique_prefix(other, everyone))
    assert theirs.exit_code == 1
    assert "no run of yours" in theirs.output
    assert await live_store.get(other) is not None


async def test_the_api_filter_takes_only_hex_prefixes(api: Api, live_store: RunStore) -> None:
    run = (await live_store.enqueue("default", "acme", {})).run
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        found = await http.get("/v1/runs", params={"id_prefix": str(run.id)[:13]})
        assert [r["id"] for r in found.json()["items"]] == [str(run.id)]
        assert (await http.get("/v1/runs", params={"id_prefix": str(run.id).upper()})
                ).json()["items"][0]["id"] == str(run.id)
        for hostile in ("0%", "%%%%%%%%", "________", "01a2b3c", "0" * 37, "'; select 1--",
                        "0123456789abcdef0123456789abcdef0"):
            refused = await http.get("/v1/runs", params={"id_prefix": hostile})
            assert refused.status_code == 422, (hostile, refused.text)


async def test_console_search_finds_a_run_by_the_start_of_its_id(
        api: Api, live_store: RunStore) -> None:
    run = (await live_store.enqueue("default", "acme", {}, idempotency_key="k")).run
    async with httpx.AsyncClient(base_url=api.url) as http:
        signed = await http.post("/ui/login", data={"token": api.token("acme")})
        assert signed.status_code == 303
        table = await http.get("/ui/runs/table", params={"q": str(run.id)[:18]})
        assert table.status_code == 200
        assert f'data-run="{run.id}"' in table.text
        by_key = await http.get("/ui/runs/table", params={"q": "k"})
        assert f'data-run="{run.id}"' in by_key.text
    # Hostile: another tenant's search by the same start finds nothing.
    async with httpx.AsyncClient(base_url=api.url) as other:
        await other.post("/ui/login", data={"token": api.token("globex")})
        theirs = await other.get("/ui/runs/table", params={"q": str(run.id)[:18]})
        assert theirs.status_code == 200
        assert str(run.id) not in theirs.text
        for hostile in ("%%%%%%%%", "________", "0" * 33, "'; select 1 --"):
            probe = await other.get("/ui/runs/table", params={"q": hostile})
            assert probe.status_code in (200, 400), (hostile, probe.status_code)
            assert str(run.id) not in probe.text


async def test_labels_are_key_equals_value_everywhere(api: Api, live_store: RunStore) -> None:
    await live_store.enqueue_many("default", [
        NewRun("acme", {}, labels={"team": v}) for v in ("search", "ads", "a=b:c")])
    for option, spelling in (("--label", "team=search"), ("--label", "team:search"),
                             ("-l", "team=search")):
        listed = await invoke(api, "acme", "runs", "list", option, spelling, "-o", "json")
        assert listed.exit_code == 0, listed.output
        assert [r["labels"] for r in json.loads(listed.stdout)["items"]] == [
            {"team": "search"}]
    # The first = or : ends the key (a key has neither); the value keeps the rest.
    odd = await invoke(api, "acme", "runs", "list", "--label", "team=a=b:c", "-o", "json")
    assert [r["labels"] for r in json.loads(odd.stdout)["items"]] == [{"team": "a=b:c"}]
    bad = await invoke(api, "acme", "runs", "list", "--label", "team")
    assert bad.exit_code == 2
    assert "key=value" in bad.output
    dry = await invoke(api, "acme", "runs", "cancel", "-l", "team=ads", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run: 1 run would be cancelled" in dry.output
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        answer = await http.get("/v1/runs", params={"label": "team=ads"})
        assert [r["labels"] for r in answer.json()["items"]] == [{"team": "ads"}]
        bulk = await http.post("/v1/runs/cancel", json={"filter": {"label": ["team=ads"]},
                                                        "dry_run": True})
        assert bulk.json()["matched"] == 1
