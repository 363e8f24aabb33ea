"""The API through a database restart: once the server accepts connections
again, no request fails. The connection pool's connections died with the old server; a
request must not be handed one of them (issue 11, item 11)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from runlease.db.embedded import EmbeddedPostgres
from tests.support.api import serve_api
from tests.support.pg import own_postgres

pytestmark = pytest.mark.slow


@pytest.fixture
def pg() -> Iterator[EmbeddedPostgres]:
    with own_postgres() as server:
        yield server


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_no_request_fails_once_the_restarted_database_accepts_connections(
    pg: EmbeddedPostgres, mode: str
) -> None:
    async with serve_api(pg.url) as api, httpx.AsyncClient(
            base_url=api.url, headers=api.headers("acme"), timeout=30) as http:
        first = (await http.post("/v1/runs", json={"input": {"steps": []}})).json()

        # Requests at once, so the connection pool holds several to lose.
        answers = await asyncio.gather(*(http.get(f"/v1/runs/{first['id']}")
                                         for _ in range(12)))
        assert {a.status_code for a in answers} == {200}
        port = pg.port

        # restart() returns once pg_isready says the server accepts connections.
        await asyncio.to_thread(pg.restart, mode)
        assert pg.port == port

        statuses: list[tuple[str, int]] = []
        for i in range(6):  # one at a time: each could be handed a dead connection
            got = await http.get(f"/v1/runs/{first['id']}")
            listed = await http.get("/v1/runs", params={"limit": 5})
            submitted = await http.post("/v1/runs", json={"input": {"steps": []}},
                                        headers={"Idempotency-Key": f"after-restart-{i}"})
            statuses += [("get", got.status_code), ("list", listed.status_code),
                         ("submit", submitted.status_code)]
        answers = await asyncio.gather(*(http.get(f"/v1/runs/{first['id']}")
                                         for _ in range(12)))
        statuses += [("get", a.status_code) for a in answers]
        ready = await http.get("/readyz")

    failed = [(what, status) for what, status in statuses if status >= 400]
    assert failed == [], f"requests failed after the database came back: {failed}"
    assert ready.status_code == 200
