"""Words a new user reads: no "redriveed", "submitted 1 runs" or "1 pending
ones"; `pools set --help` does not point at itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from click.testing import CliRunner, Result

from runlease.cli import main as cli
from runlease.db.store import RunStore
from tests.support.api import Api


async def invoke(api: Api, who: str, *args: str) -> Result:
    result = await asyncio.to_thread(
        CliRunner().invoke, cli, [*args, "--api-url", api.url, "--token", api.token(who)])
    assert result.exit_code == 0, result.output
    return result


async def test_counts_and_verbs_read_right(ui: Api, live_store: RunStore,
                                           tmp_path: Path) -> None:
    await live_store.enqueue("default", "acme", {})
    [lease] = await live_store.claim("default", "test-worker", 1)
    await live_store.fail(lease, "refused", "no")
    dry = await invoke(ui, "admin", "runs", "redrive", "--all", "--dry-run")
    assert "dry run: 1 run would be redriven" in dry.output
    dead_dry = await invoke(ui, "admin", "dead", "redrive", str(lease.run_id), "--dry-run")
    assert "dry run: 1 run would be redriven" in dead_dry.output
    assert (await live_store.get(lease.run_id)).status == "dead"
    cancel = await invoke(ui, "acme", "runs", "cancel", "--all", "--dry-run")
    assert "dry run: 0 runs would be cancelled" in cancel.output
    one = tmp_path / "one.jsonl"
    one.write_text('{"input": {"delay": true}, "delay_s": 600}\n')
    dry_file = await invoke(ui, "acme", "runs", "submit", "--file", str(one), "--dry-run")
    assert "dry run: 1 run would be submitted" in dry_file.output
    assert len(await live_store.list_runs()) == 1  # the dead one only
    submitted = await invoke(ui, "acme", "runs", "submit", "--file", str(one))
    assert "submitted 1 run\n" in submitted.output
    helped = CliRunner().invoke(cli, ["pools", "set", "--help"])
    assert "also: `pools set`" not in helped.output
    assert "`pools set` and `pools upsert` are one command" in helped.output
    async with httpx.AsyncClient(base_url=ui.url) as browser:
        await browser.post("/ui/login", data={"token": ui.token("acme")})
        table = (await browser.get("/ui/runs/table")).text
    assert "1 pending run waits for a retry or a later start" in table
    assert "ones" not in table
