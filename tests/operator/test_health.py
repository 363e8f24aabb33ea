"""The operator's /healthz and /readyz (operator/health.py), kopf in-process
against KMock, with a PostgreSQL of the test's own that it stops."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx

from runlease.operator.health import Health
from tests.operator.conftest import (
    DEPLOYMENTS,
    create_pool,
    database_secret,
    requests_of,
    running_operator,
    stored,
)
from tests.support.pg import own_postgres
from tests.support.waiting import eventually


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_readiness_falls_with_a_pool_database_and_comes_back(
    kmock: Any, kubeconfig: str
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with own_postgres() as pg:
        database_secret(kmock, pg.url)
        async with running_operator(kmock, metrics_port=port, metrics_host="127.0.0.1"), \
                httpx.AsyncClient(base_url=base, timeout=10) as http:

            async def probe(path: str) -> tuple[int, str]:
                response = await http.get(path)
                return response.status_code, response.text

            await create_pool(kmock, "batch")
            await eventually(lambda: stored(kmock, DEPLOYMENTS, "batch-workers"))
            ready = await probe("/readyz")
            assert ready == (200, "ok: 1 databases\n"), ready
            status, text = await probe("/healthz")
            assert status == 200
            assert text.startswith("ok: ")
            assert "watch streams" in text
            assert text != "ok: 0 watch streams\n"

            await asyncio.to_thread(pg.stop, "fast")
            for _ in range(100):
                status, text = await probe("/readyz")
                if status == 503:
                    break
                await asyncio.sleep(0.1)
            assert status == 503
            assert text.startswith("database unreachable: 127.0.0.1:")
            assert "postgres@" not in text  # the place, never the URL
            assert (await probe("/healthz"))[0] == 200  # alive: only not ready
            # The database error is an Event on the pool too.
            await eventually(lambda: any(
                isinstance(r.data, dict) and r.data.get("type") == "Warning"
                and r.data.get("reason") == "ReconcileError"
                and "batch" in str(r.data.get("involvedObject"))
                for r in requests_of(kmock, method="POST", resource="v1/events")), wait_s=20)

            await asyncio.to_thread(pg.start)
            for _ in range(200):
                if (await probe("/readyz"))[0] == 200:
                    break
                await asyncio.sleep(0.1)
            assert (await probe("/readyz"))[0] == 200


class FakeDatabases:
    count = 0

    async def unreachable(self, timeout_s: float) -> list[str]:
        return []


class DownApi:
    async def ping(self, namespace: str | None) -> None:
        raise ConnectionRefusedError("connection refused")


async def test_liveness_and_readiness_without_kopf_running() -> None:
    dbs: Any = FakeDatabases()
    api: Any = DownApi()
    health = Health(dbs, api, "ns", started=lambda: True)
    # No kopf orchestrator task in this loop: not alive.
    assert health.live() == (False, "kopf's orchestrator is not running")
    ok, detail = await health.ready()
    assert not ok
    assert detail.startswith("Kubernetes API unreachable: ConnectionRefusedError")
    starting = Health(dbs, api, "ns", started=lambda: False)
    assert await starting.ready() == (False, "kopf is starting")
