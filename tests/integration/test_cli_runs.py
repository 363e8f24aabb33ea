"""`runlease runs submit --file` (batches of 1,000, progress bar) and
`runlease runs list` with filters, against a real API."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import psycopg

from tests.support.api import Api


async def cli(api: Api, *args: str, who: str = "acme") -> tuple[int, str, str]:
    env = {**os.environ, "RUNLEASE_API_URL": api.url, "RUNLEASE_TOKEN": api.token(who),
           "COLUMNS": "200"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlease", "runs", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def write_jsonl(path: Path, runs: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    return str(path)


async def test_submit_a_file_in_batches_then_again(api: Api, db_url: str,
                                                   tmp_path: Path) -> None:
    runs = [{"input": {"i": i}, "idempotency_key": f"line-{i}"} for i in range(2500)]
    path = write_jsonl(tmp_path / "runs.jsonl", runs)
    code, out, err = await cli(api, "submit", "--file", path, "--label", "suite=cli")
    assert code == 0, err
    assert "submitted 2500 runs" in out
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*), count(*) FILTER (WHERE labels = "
                            "'{\"suite\": \"cli\"}') FROM agent_runs").fetchone() == (2500, 2500)
    code, out, err = await cli(api, "submit", "--file", path, "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert len(answer) == 2500
    assert not any(r["created"] for r in answer)


async def test_a_bad_file_submits_nothing(api: Api, db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text('{"input": {}}\nnot json\n')
    code, _, err = await cli(api, "submit", "--file", str(path))
    assert code == 2
    assert "line 2: not JSON" in err
    path = write_jsonl(tmp_path / "refused.jsonl", [{"input": {}}, {"input": {}, "priority": 900}])
    code, _, err = await cli(api, "submit", "--file", path)
    assert code == 1
    assert "runs[1].priority" in err
    code, _, err = await cli(api, "submit")
    assert code == 2
    assert "--input" in err
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM agent_runs").fetchone() == (0,)


async def test_submit_with_labels_and_delay_then_list_by_filter(api: Api) -> None:
    code, out, err = await cli(api, "submit", "--input", '{"a": 1}', "--label", "team=search",
                               "--delay-s", "120", "--json")
    assert code == 0, err
    later = json.loads(out)
    assert later["labels"] == {"team": "search"}
    assert later["available_at"] > later["created_at"]
    code, out, err = await cli(api, "submit", "--input", '{"a": 2}', "--label", "team=ads",
                               "--json")
    other = json.loads(out)

    code, out, err = await cli(api, "list", "--label", "team:search", "--json")
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)["items"]] == [later["id"]]
    code, out, _ = await cli(api, "list", "--status", "pending", "--status", "done",
                             "--created-after", later["created_at"], "--json")
    assert [r["id"] for r in json.loads(out)["items"]] == [other["id"], later["id"]]
    code, out, _ = await cli(api, "list", "--label", "team:search", who="globex")
    assert code == 0
    assert later["id"] not in out
    code, _, err = await cli(api, "list", "--created-after", "2026-01-01T00:00:00")
    assert code == 2
    assert "offset" in err
    code, out, _ = await cli(api, "list", "--label", "team:ads")
    assert code == 0
    assert other["id"] in out
