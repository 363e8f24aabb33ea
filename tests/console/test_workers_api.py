"""GET /v1/workers (admin) and the console's workers page, over the
agent_run_workers registry, against a real API server and PostgreSQL."""

from __future__ import annotations

import httpx

from runlease.db.store import RunStore
from runlease.db.workers import Registration
from tests.support.api import Api


async def test_workers_api_lists_the_registry_for_admins(api: Api, live_store: RunStore) -> None:
    await live_store.register_worker(Registration("pod-a:boot:1", "default", 8), lease_s=30)
    await live_store.register_worker(Registration("pod-b:boot:7", "gpu", 2), lease_s=30)
    async with httpx.AsyncClient(base_url=api.url) as http:
        r = await http.get("/v1/workers", headers=api.headers("admin"))
        assert r.status_code == 200
        items = r.json()["items"]
        assert [(w["id"], w["pool"], w["concurrency"], w["runs_held"], w["alive"])
                for w in items] == [("pod-a:boot:1", "default", 8, 0, True),
                                    ("pod-b:boot:7", "gpu", 2, 0, True)]
        assert items[0]["version"]
        assert items[0]["heartbeat_at"]
        assert items[0]["expires_at"]
        gpu = await http.get("/v1/workers", params={"pool": "gpu"}, headers=api.headers("admin"))
        assert [w["id"] for w in gpu.json()["items"]] == ["pod-b:boot:7"]
        assert (await http.get("/v1/workers", headers=api.headers("acme"))).status_code == 403
        assert (await http.get("/v1/workers")).status_code == 401
        bad = await http.get("/v1/workers", params={"limit": 0}, headers=api.headers("admin"))
        assert bad.status_code == 422


async def test_console_workers_page(api: Api, live_store: RunStore) -> None:
    await live_store.register_worker(Registration("pod-<script>x</script>:b:1", "default", 4),
                                     lease_s=30)
    async with httpx.AsyncClient(base_url=api.url) as http:
        r = await http.post("/ui/login", data={"token": api.token("admin")})
        assert r.status_code == 303
        page = await http.get("/ui/workers")
        assert page.status_code == 200
        assert "pod-&lt;script&gt;x&lt;/script&gt;:b:1" in page.text
        assert "<script>x" not in page.text
        assert "0 / 4" in page.text
        assert "live" in page.text
        empty = await http.get("/ui/workers", params={"pool": "gpu"})
        assert "No worker of pool gpu is registered" in empty.text
