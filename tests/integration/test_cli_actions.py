"""`runlease runs cancel|redrive|reprioritize` and the retry options of
`runlease runs submit`, against a served API."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from click.testing import CliRunner, Result

from runlease.cli import main as cli
from runlease.db.store import NewRun, RunStore
from tests.support.api import Api


async def invoke(api: Api, who: str, *args: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke, cli, [*args, "--api-url", api.url, "--token", api.token(who)])


async def as_json(api: Api, who: str, *args: str) -> Any:
    result = await invoke(api, who, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


async def test_cancel_by_filter_with_a_dry_run_first(api: Api, live_store: RunStore) -> None:
    await live_store.enqueue_many("default", [NewRun("acme", {}) for _ in range(3)])
    await live_store.enqueue("default", "globex", {})
    dry = await invoke(api, "acme", "runs", "cancel", "--status", "pending", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run: 3 runs would be cancelled" in dry.output
    done = await as_json(api, "acme", "runs", "cancel", "--status", "pending")
    assert (done["matched"], done["affected"], done["action"]) == (3, 3, "cancel")
    assert [r.tenant_id for r in await live_store.list_runs(status="pending")] == ["globex"]
    mixed = await invoke(api, "acme", "runs", "cancel", str(done["ids"][0]), "--pool",
                         "default")
    assert mixed.exit_code != 0
    assert "not both" in mixed.output


async def test_cancel_by_label(api: Api, live_store: RunStore) -> None:
    await live_store.enqueue_many("default", [
        NewRun("acme", {}, labels={"agent_version": v}) for v in ("1", "2", "2")])
    dry = await as_json(api, "acme", "runs", "cancel", "--label", "agent_version:2",
                        "--status", "pending", "--dry-run")
    assert (dry["matched"], dry["affected"]) == (2, 0)
    done = await invoke(api, "acme", "runs", "cancel", "--label", "agent_version:2")
    assert done.exit_code == 0, done.output
    assert "cancel: 2 of 2 runs" in done.output


async def test_cancel_of_one_run_keeps_its_answer(api: Api, live_store: RunStore) -> None:
    queued = await live_store.enqueue("default", "acme", {})
    result = await invoke(api, "acme", "runs", "cancel", str(queued.run.id))
    assert result.exit_code == 0, result.output
    assert f"{queued.run.id}: cancelled" in result.output
    again = await invoke(api, "acme", "runs", "cancel", str(queued.run.id))
    assert again.exit_code == 1
    assert "409" in again.output


async def test_redrive_by_ids_and_by_pool(api: Api, live_store: RunStore) -> None:
    await live_store.enqueue_many("default", [NewRun("acme", {}) for _ in range(3)])
    leases = await live_store.claim("default", "test-worker", 3)
    for lease in leases:
        await live_store.fail(lease, "refused", "no")
    refused = await invoke(api, "acme", "runs", "redrive", str(leases[0].run_id))
    assert refused.exit_code != 0
    assert "admin only" in refused.output  # as the API says (issue 32)
    one = await as_json(api, "admin", "runs", "redrive", str(leases[0].run_id))
    assert one["affected"] == 1
    rest = await invoke(api, "admin", "runs", "redrive", "--pool", "default", "--tenant",
                        "acme")
    assert rest.exit_code == 0, rest.output
    assert "redrive: 2 of 2 runs" in rest.output
    assert {r.status for r in await live_store.list_runs()} == {"pending"}


async def test_reprioritize_and_submit_with_a_retry_policy(api: Api) -> None:
    run = await as_json(api, "acme", "runs", "submit", "--input", "{}", "--backoff-base-s",
                        "30", "--backoff-cap-s", "600", "--non-retryable", "refused",
                        "--non-retryable", "invalid_input")
    assert (run["backoff_base_s"], run["backoff_cap_s"], run["non_retryable_codes"]) == (
        30, 600, ["refused", "invalid_input"])
    moved = await invoke(api, "acme", "runs", "reprioritize", run["id"], "--priority", "-7")
    assert moved.exit_code == 0, moved.output
    assert "priority -7" in moved.output
    refused = await invoke(api, "acme", "runs", "submit", "--input", "{}",
                           "--non-retryable", "Not A Code")
    assert refused.exit_code == 1
    assert "non_retryable_codes" in refused.output
