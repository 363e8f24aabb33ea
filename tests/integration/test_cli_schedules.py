"""`runlease schedules create|list|show|pause|resume|delete` against a served API."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from click.testing import CliRunner, Result

from runlease.cli import main as cli
from tests.support.api import Api


async def invoke(api: Api, who: str, *args: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke, cli, [*args, "--api-url", api.url, "--token", api.token(who)])


async def as_json(api: Api, who: str, *args: str) -> Any:
    result = await invoke(api, who, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


async def test_the_schedule_commands(api: Api) -> None:
    made = await as_json(api, "acme", "schedules", "create", "nightly", "--cron", "30 2 * * *",
                         "--timezone", "Europe/Berlin", "--input", '{"suite": "eval"}',
                         "--priority", "2", "--backoff-base-s", "60", "--non-retryable",
                         "refused")
    assert made["template"] == {"input": {"suite": "eval"}, "pool": "default", "priority": 2,
                                "backoff_base_s": 60, "non_retryable_codes": ["refused"]}
    listed = await invoke(api, "acme", "schedules", "list", "--wide")
    assert listed.exit_code == 0, listed.output
    assert "nightly" in listed.output
    assert "Europe/Berlin" in listed.output
    assert (await invoke(api, "globex", "schedules", "show", made["id"])).exit_code == 1
    paused = await invoke(api, "acme", "schedules", "pause", made["id"])
    assert "paused: nightly" in paused.output
    resumed = await as_json(api, "acme", "schedules", "resume", made["id"])
    assert resumed["paused"] is False
    bad = await invoke(api, "acme", "schedules", "create", "x", "--cron", "61 * * * *",
                       "--input", "{}")
    assert bad.exit_code == 1
    assert "cron" in bad.output
    deleted = await invoke(api, "acme", "schedules", "delete", made["id"])
    assert deleted.exit_code == 0, deleted.output
    gone = await invoke(api, "acme", "schedules", "show", made["id"])
    assert gone.exit_code == 1
    assert "404" in gone.output
