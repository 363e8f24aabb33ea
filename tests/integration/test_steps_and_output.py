"""What a run's tools did, visible: GET /v1/runs/{id}/steps (the committed
steps, tenant-scoped, paged, bounded) and a shell step's output as live,
redacted `tool.output` events."""

from __future__ import annotations

import asyncio
from uuid import uuid4

import httpx

from runlease.client import AsyncClient, RunEnded, StreamEvent
from runlease.db.store import RunStore
from tests.support.api import Api
from tests.support.workers import running_worker


def shells(*commands: str) -> dict[str, object]:
    return {"steps": [{"shell": ["sh", "-c", c]} for c in commands]}


async def test_steps_are_paged_in_key_order_and_tenant_scoped(
        api: Api, db_url: str, live_store: RunStore) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme, running_worker(db_url):
        run = await acme.submit(shells("echo zero", "echo one", "echo two"))
        assert (await acme.wait(run.id, timeout_s=60)).status == "done"
        first = await acme.steps(run.id, limit=2)
        second = await acme.steps(run.id, limit=2, cursor=first.next_cursor)
    assert [s.key for s in first.items] == ["0", "1"]
    assert first.next_cursor == "1"
    assert [s.key for s in second.items] == ["2"]
    assert second.next_cursor is None
    assert first.items[0].result["stdout"] == "zero\n"
    assert (first.items[0].attempt, first.items[0].lease_epoch) == (1, 1)
    # The byte budget: a page holds at least one step, then stops at the bound.
    items, cursor = await live_store.steps_page(run.id, limit=10, max_bytes=1)
    assert ([s.step_key for s in items], cursor) == (["0"], "0")

    async with httpx.AsyncClient(base_url=api.url) as http:
        url = f"/v1/runs/{run.id}/steps"
        other = await http.get(url, headers=api.headers("globex"))
        assert other.status_code == 404
        assert "zero" not in other.text
        assert (await http.get(url)).status_code == 401
        admin = await http.get(url, headers=api.headers("admin"))
        assert len(admin.json()["items"]) == 3
        missing = await http.get(f"/v1/runs/{uuid4()}/steps", headers=api.headers("acme"))
        assert missing.status_code == 404
        for params in ({"cursor": "\x00"}, {"cursor": "x" * 256}, {"limit": 0},
                       {"limit": 101}, {"limit": "many"}, {"cursor": ""}):
            bad = await http.get(url, params=params, headers=api.headers("acme"))
            assert bad.status_code == 422, (params, bad.text)
            assert bad.json()["error"]["field"] in ("cursor", "limit")
        odd = await http.get(f"{url}?cursor=%FF%FE%00x", headers=api.headers("acme"))
        assert odd.status_code in (200, 422), odd.text
        bad_id = await http.get("/v1/runs/not-a-uuid/steps", headers=api.headers("acme"))
        assert bad_id.status_code == 422


async def test_a_shell_steps_output_is_streamed_while_it_runs_and_redacted(
        api: Api, db_url: str) -> None:
    script = ("echo compiling; echo 'api_key=hunter2hunter2'; echo warning >&2; "
              "sleep 300")
    async with AsyncClient(api.url, api.token("acme")) as acme, running_worker(db_url):
        run = await acme.submit(shells(script))
        seen: list[StreamEvent] = []

        async def follow() -> None:
            async for item in acme.events(run.id):
                assert isinstance(item, StreamEvent), item
                seen.append(item)
                text = "".join(e.data["text"] for e in seen if e.kind == "tool.output")
                if "compiling" in text and "warning" in text:
                    return

        # The tool is still sleeping: what it printed is already out.
        await asyncio.wait_for(follow(), 60)
        assert (await acme.get(run.id)).status == "leased"
        await acme.cancel(run.id)
        assert (await acme.wait(run.id, timeout_s=30)).status == "cancelled"
    outputs = [e.data for e in seen if e.kind == "tool.output"]
    assert {d["step"] for d in outputs} == {0}
    assert {d["stream"] for d in outputs} == {"stdout", "stderr"}
    assert "compiling\n" in "".join(d["text"] for d in outputs if d["stream"] == "stdout")
    assert "hunter2" not in repr(outputs)


async def test_output_is_bounded_and_ends_with_the_exit_code(api: Api, db_url: str) -> None:
    script = "head -c 300000 /dev/zero | tr '\\0' 'x' | fold -w 100; echo; exit 0"
    async with AsyncClient(api.url, api.token("acme")) as acme, running_worker(db_url):
        run = await acme.submit(shells(script))
        items = [i async for i in acme.events(run.id)]
    events = [i for i in items if isinstance(i, StreamEvent)]
    assert items[-1] == RunEnded("done", None, 1)
    outputs = [e.data for e in events if e.kind == "tool.output"]
    shown = sum(len(d["text"]) for d in outputs if d["stream"] == "stdout")
    assert 60_000 < shown <= 64 * 1024
    assert outputs[-1]["truncated"] is True
    assert events[-1].kind == "tool.exit"
    assert events[-1].data["step"] == 0
    assert events[-1].data["returncode"] == 0
