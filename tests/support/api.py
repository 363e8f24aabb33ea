"""The API served for real (uvicorn on a free port) inside the test's loop.
Its fixtures `api` and `ui` are in api_fixtures.py (the pytest plugin): this
module imports no pytest, so bench/ uses it with `.[bench]` alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from runlease.api.app import create_app
from runlease.api.auth import ADMIN, TokenRegistry
from runlease.api.server import ApiServer
from runlease.settings import ApiSettings, load

TOKENS = {"acme": "acme-token-0123456789", "globex": "globex-token-0123456789"}
ADMIN_TOKEN = "admin-token-0123456789"


@dataclass
class Api:
    url: str
    server: ApiServer

    def headers(self, who: str | None) -> dict[str, str]:
        if who is None:
            return {}
        token = ADMIN_TOKEN if who == "admin" else TOKENS[who]
        return {"Authorization": f"Bearer {token}"}

    def token(self, who: str) -> str:
        return ADMIN_TOKEN if who == "admin" else TOKENS[who]


@asynccontextmanager
async def serve_api(db_url: str, **settings: Any) -> AsyncIterator[Api]:
    registry = TokenRegistry()
    for tenant, token in TOKENS.items():
        registry.add_tenant(tenant, token)
    registry.add(ADMIN_TOKEN, ADMIN)
    values = {"database_url": db_url, "port": 0, "sse_poll_s": 0.2,
              "sse_keepalive_s": 1.0} | settings
    app = create_app(load(ApiSettings, values, environ={}), tokens=registry)
    server = ApiServer(app, "127.0.0.1", 0, own_signals=False)
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "the API did not start"
        await asyncio.sleep(0.01)
    try:
        yield Api(f"http://127.0.0.1:{server.port}", server)
    finally:
        server.stop()
        try:
            await asyncio.wait_for(asyncio.shield(task), 5)
        except TimeoutError:
            server.force_exit = True
            await task


CONSOLE_SECRET = "console-test-secret-0123456789"
