"""One rule for redrive: admin only, on every path (the HTTP routes for one
run and for many, both SDKs, the CLI's `runs redrive` and `dead redrive`,
the console). A tenant's CLI used to redrive through the bulk route while
the docs and the single route said admin only."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from click.testing import CliRunner

from runlease.cli import main as cli
from runlease.client import ApiError, AsyncClient, Client
from runlease.db.store import RunStore
from tests.support.api import Api


async def dead_run(store: RunStore) -> str:
    await store.enqueue("default", "acme", {})
    [lease] = await store.claim("default", "test-worker", 1)
    await store.fail(lease, "refused", "no")
    return str(lease.run_id)


async def test_a_tenant_redrives_nothing_on_any_path(ui: Api, live_store: RunStore) -> None:
    api = ui
    run_id = await dead_run(live_store)
    token = api.token("acme")
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        for path, body in ((f"/v1/runs/{run_id}/redrive", None),
                           ("/v1/runs/redrive", {"ids": [run_id]}),
                           ("/v1/runs/redrive", {"filter": {"status": ["dead"]}}),
                           ("/v1/runs/redrive", {"filter": {}, "dry_run": True})):
            answer = await http.post(path, json=body)
            assert answer.status_code == 403, (path, body, answer.text)
    async with AsyncClient(api.url, token) as acme:
        for call in (acme.redrive(run_id), acme.bulk_redrive([run_id])):
            with pytest.raises(ApiError) as refused:
                await call
            assert refused.value.status == 403

    def sync_and_cli() -> None:
        with Client(api.url, token) as acme:
            with pytest.raises(ApiError):
                acme.redrive(run_id)
            with pytest.raises(ApiError):
                acme.bulk_redrive(status=["dead"])
        for args in (("runs", "redrive", run_id), ("runs", "redrive", "--all"),
                     ("runs", "redrive", "--pool", "default", "--dry-run"),
                     ("dead", "redrive", run_id)):
            result = CliRunner().invoke(cli, [*args, "--api-url", api.url, "--token", token])
            assert result.exit_code == 1, (args, result.output)
            assert "403" in result.output

    await asyncio.to_thread(sync_and_cli)
    async with httpx.AsyncClient(base_url=api.url) as browser:
        await browser.post("/ui/login", data={"token": token})
        shown = await browser.get(f"/ui/runs/{run_id}")
        csrf = re.search(r'name="csrf" value="([^"]+)"', shown.text)
        assert csrf, shown.text[:500]
        page = await browser.post(f"/ui/runs/{run_id}/redrive", data={"csrf": csrf.group(1)},
                                  headers={"Origin": api.url})
        assert page.status_code == 403, page.text[:500]
        assert "Only an admin" in page.text
    assert (await live_store.get(run_id)).status == "dead"

    async with AsyncClient(api.url, api.token("admin")) as admin:
        assert (await admin.bulk_redrive([run_id])).affected == 1
    assert (await live_store.get(run_id)).status == "pending"
