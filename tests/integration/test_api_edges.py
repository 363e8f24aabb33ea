"""API edges a newcomer meets first: a probe that answers quickly with the
database down, a 415 that says what to send, a 409 for cancelling a run that
is already finished."""

from __future__ import annotations

import time

import httpx
import psycopg
import pytest

from runlease.client import ApiError, AsyncClient, Conflict
from runlease.db.embedded import free_port
from tests.support.api import Api, serve_api
from tests.support.workers import running_worker

# The chart's readiness probe gives up after this (charts/runlease: timeoutSeconds).
PROBE_TIMEOUT_S = 3


def count_runs(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        return int(conn.execute("SELECT count(*) FROM agent_runs").fetchone()[0])  # type: ignore[index]


async def test_readyz_answers_before_the_probe_times_out_with_no_database() -> None:
    nothing = f"postgresql://runlease@127.0.0.1:{free_port()}/runlease?connect_timeout=30"
    async with serve_api(nothing) as api, httpx.AsyncClient(base_url=api.url) as http:
        for _ in range(2):  # the first, and one while the pool keeps trying
            started = time.monotonic()
            ready = await http.get("/readyz", timeout=PROBE_TIMEOUT_S)
            print(f"/readyz answered in {time.monotonic() - started:.2f} s")
            assert ready.status_code == 503
            assert ready.json()["error"]["code"] == "not_ready"
        assert (await http.get("/healthz")).status_code == 200


async def test_a_body_without_json_content_type_is_a_415_saying_what_to_send(
        api: Api, db_url: str) -> None:
    body = b'{"input": {"steps": []}}'
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        for headers in ({}, {"Content-Type": "text/plain"},
                        {"Content-Type": "application/x-www-form-urlencoded"},
                        {"Content-Type": "application/jsonx"}, {"Content-Type": "\x7f;;"}):
            answer = await http.post("/v1/runs", content=body, headers=headers)
            assert answer.status_code == 415, (headers, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "unsupported_media_type"
            assert error["field"] == "Content-Type"
            assert "application/json" in error["message"]
        assert count_runs(db_url) == 0
        ok = await http.post("/v1/runs", content=body,
                             headers={"Content-Type": "application/json; charset=utf-8"})
        assert ok.status_code == 201, ok.text
        put = await http.put("/v1/pools/batch", content=b"{}", headers=api.headers("admin"))
        assert put.status_code == 415
        # Routes without a body need no Content-Type.
        run_id = ok.json()["id"]
        assert (await http.post(f"/v1/runs/{run_id}/cancel")).status_code == 202


async def test_cancelling_a_finished_run_is_a_409_that_names_its_status(
        api: Api, db_url: str) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme:
        pending = await acme.submit({"steps": []})  # no worker yet: it waits
        assert (await acme.cancel(pending.id)).status == "cancelled"
        with pytest.raises(Conflict) as again:
            await acme.cancel(pending.id)
        assert again.value.status == 409
        assert again.value.code == "invalid_transition"
        assert "cancelled" in again.value.message
        async with running_worker(db_url):
            run = await acme.submit({"steps": []})
            assert (await acme.wait(run.id, timeout_s=30)).status == "done"
        with pytest.raises(ApiError) as done:
            await acme.cancel(run.id)
        assert done.value.status == 409
        assert "done" in done.value.message
        assert (await acme.get(run.id)).status == "done"
    async with httpx.AsyncClient(base_url=api.url) as http:
        other = await http.post(f"/v1/runs/{run.id}/cancel", headers=api.headers("globex"))
        assert other.status_code == 404  # another tenant's finished run: no hint
