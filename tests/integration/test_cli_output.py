"""The CLI's output as kubectl's `get` prints it (cli/output.py): tables
readable at 80 columns and greppable in a pipe, -o wide|json|yaml|name,
--no-headers, RFC 3339 times, no Python `None`/`False` in `runs show`."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import yaml
from click.testing import CliRunner, Result

from runlease.cli import main as cli
from runlease.db.store import NewRun, RunStore
from tests.support.api import Api

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


async def invoke(api: Api, who: str, *args: str) -> Result:
    # A pipe of 80 columns, as `runlease runs list | grep ...` in a small terminal.
    runner = CliRunner(env={"COLUMNS": "80"})
    result = await asyncio.to_thread(
        runner.invoke, cli, [*args, "--api-url", api.url, "--token", api.token(who)])
    assert result.exit_code == 0, result.output
    return result


async def some_runs(store: RunStore) -> tuple[str, str]:
    """A dead run and a pending one of acme, a pending one of globex."""
    await store.enqueue_many("default", [NewRun("acme", {}, labels={"team": "search"})])
    [lease] = await store.claim("default", "test-worker", 1)
    await store.fail(lease, "refused", "no")
    pending = await store.enqueue("default", "acme", {})
    await store.enqueue("default", "globex", {})
    return str(lease.run_id), str(pending.run.id)


async def test_runs_list_fits_80_columns_with_whole_ids_and_greps(
        api: Api, live_store: RunStore) -> None:
    dead, pending = await some_runs(live_store)
    result = await invoke(api, "acme", "runs", "list")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "POOL", "ATTEMPTS", "AGE"]
    assert all(len(line) <= 80 for line in lines), result.stdout
    assert not set("│┃━─…") & set(result.stdout)
    [dead_line] = [line for line in lines if "dead" in line]  # `| grep dead`
    assert dead_line.split()[:4] == [dead, "dead", "default", "1/3"]
    assert any(line.split()[:2] == [pending, "pending"] for line in lines)
    bare = await invoke(api, "acme", "runs", "list", "--no-headers")
    # The same rows without the header; AGE (last) may have ticked a second
    # between the two listings.
    assert [line.split()[:-1] for line in bare.stdout.splitlines()] == [
        line.split()[:-1] for line in lines[1:]]
    # An admin's listing spans tenants: TENANT appears, as NAMESPACE under -A.
    every = await invoke(api, "admin", "runs", "list")
    assert every.stdout.splitlines()[0].split()[:3] == ["ID", "TENANT", "STATUS"]


async def test_wide_json_yaml_and_name(api: Api, live_store: RunStore) -> None:
    dead, pending = await some_runs(live_store)
    wide = await invoke(api, "acme", "runs", "list", "-o", "wide")
    header = wide.stdout.splitlines()[0].split()
    assert {"TENANT", "ERROR", "LABELS", "CREATED"} <= set(header)
    [dead_line] = [line for line in wide.stdout.splitlines() if line.startswith(dead)]
    assert "refused" in dead_line
    assert "team=search" in dead_line
    assert ISO.match(dead_line.split()[-1]), dead_line
    assert (await invoke(api, "acme", "runs", "list", "--wide")).stdout == wide.stdout

    page: Any = json.loads((await invoke(api, "acme", "runs", "list", "-o", "json")).stdout)
    assert [r["id"] for r in page["items"]] == [pending, dead]
    assert all(ISO.match(r["created_at"]) for r in page["items"])
    as_yaml = yaml.safe_load((await invoke(api, "acme", "runs", "list", "-o", "yaml")).stdout)
    assert as_yaml == page
    names = await invoke(api, "acme", "runs", "list", "-o", "name")
    assert names.stdout.split() == [pending, dead]
    shown = json.loads((await invoke(api, "acme", "runs", "show", dead, "--json")).stdout)
    assert ISO.match(shown["finished_at"])


async def test_runs_show_has_no_python_values(api: Api, live_store: RunStore) -> None:
    _, pending = await some_runs(live_store)
    shown = (await invoke(api, "acme", "runs", "show", pending)).stdout
    assert "None" not in shown
    assert "False" not in shown
    lines = dict(re.split(r":\s+", line, maxsplit=1) for line in shown.splitlines()
                 if re.match(r"^[a-z_]+:", line))
    assert lines["status"] == "pending"
    assert lines["finished_at"] == "<none>"
    assert ISO.match(lines["created_at"])


async def test_pools_and_schedules_tables_are_plain_rows(api: Api) -> None:
    await invoke(api, "admin", "pools", "set", "batch", "--limit", "acme=2")
    pools = (await invoke(api, "admin", "pools", "list")).stdout.splitlines()
    assert pools[0].split()[:2] == ["NAME", "PAUSED"]
    assert sorted(line.split()[0] for line in pools[1:]) == ["batch", "default"]
    assert all(len(line) <= 80 for line in pools), pools
    assert any("acme=2" in line for line in pools)
    created = json.loads((await invoke(api, "acme", "schedules", "create", "nightly", "--cron",
                                       "0 2 * * *", "--input", "{}", "--json")).stdout)
    listed = (await invoke(api, "acme", "schedules", "list")).stdout.splitlines()
    assert listed[0].split() == ["ID", "NAME", "CRON", "STATE", "NEXT", "TICK"]
    assert listed[1].split()[:2] == [created["id"], "nightly"]
    assert re.match(r"in \d+[smhd]$", listed[1].split("   ")[-1]), listed
    wide = (await invoke(api, "acme", "schedules", "list", "-o", "wide")).stdout.splitlines()
    assert any(ISO.match(v) for v in wide[1].split()), wide
    assert all(len(line) <= 80 for line in listed), listed
