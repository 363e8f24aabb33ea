"""`runlease api` freezes what it made while starting, out of the garbage
collector's full passes (api/server.py); servers in a test process do not."""

from __future__ import annotations

import asyncio
import gc

import httpx

from runlease.api.app import create_app
from runlease.api.server import ApiServer
from runlease.settings import ApiSettings, load


async def started(db_url: str, *, freeze_gc: bool) -> int:
    """Serve once, answer one request; the freeze count right after start."""
    app = create_app(load(ApiSettings, {"database_url": db_url, "port": 0}, environ={}))
    server = ApiServer(app, "127.0.0.1", 0, own_signals=False)
    server.freeze_gc = freeze_gc
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the API did not start"
            await asyncio.sleep(0.01)
        frozen = gc.get_freeze_count()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
            assert (await http.get("/readyz")).status_code == 200
        return frozen
    finally:
        server.stop()
        await asyncio.wait_for(task, 5)
        gc.unfreeze()


async def test_the_api_process_freezes_its_startup_objects(db_url: str) -> None:
    gc.unfreeze()
    assert await started(db_url, freeze_gc=False) == 0
    assert await started(db_url, freeze_gc=True) > 10_000
