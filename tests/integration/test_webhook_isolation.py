"""Webhooks cannot stall or bloat the leader (issue 32): hostile receivers
on 127.0.0.1, a real reaper's leader (an in-process worker) and a real
worker process killed with kill -9; the dead worker's lease is reaped
within lease + reaper interval + 1 s while deliveries drip, and the
leader's memory grows by a bound, not by what receivers send."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from runlease.core.webhooks import HostRule
from runlease.db.store import RunStore
from runlease.services.webhooks import WebhookDispatcher
from tests.support.proc import ROOT, WorkerProcess, child_env
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = pytest.mark.slow

LEASE_S = 4
REAPER_INTERVAL_S = 1.0
GROWTH_BOUND_BYTES = 64 * 1024 * 1024  # a 300 MB answer buffered would pass it 4 times


@contextmanager
def receivers() -> Iterator[dict[str, int]]:
    env = child_env("") | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.hostile_receivers"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        yield json.loads(proc.stdout.readline())
        proc.stdout.close()
    finally:
        proc.kill()
        proc.wait(10)


class RssPeak:
    """The most this process held in memory while it watched (sampled)."""

    def __init__(self) -> None:
        self.peak = self.now()
        self.base = self.peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    @staticmethod
    def now() -> int:
        resident = int(Path("/proc/self/statm").read_text().split()[1])
        return resident * os.sysconf("SC_PAGE_SIZE")

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def query(db_url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


async def finished_with_webhook(store: RunStore, tenant: str, url: str) -> UUID:
    queued = await store.enqueue("default", tenant, {})
    await store.add_webhook(queued.run.id, tenant, url)
    (lease,) = await store.claim("default", "finisher", 1)
    await store.ack(lease, None)
    return queued.run.id


@asynccontextmanager
async def victim(db_url: str, tmp_path: Path, run_id: UUID) -> AsyncIterator[WorkerProcess]:
    process = WorkerProcess(db_url, tmp_path, "victim", {
        "lease_s": LEASE_S, "heartbeat_interval_s": 1, "poll_interval_s": 0.2,
        "reaper": False, "concurrency": 1, "agent": "runlease.agents.script:agent"}).start()
    try:
        async def leased() -> bool:
            rows = query(db_url, "SELECT status, locked_by FROM agent_runs WHERE id = %s", run_id)
            return rows[0][0] == "leased" and rows[0][1].startswith(process.identity_prefix)
        await until(leased, timeout_s=30, what="the victim's lease")
        yield process
    finally:
        process.cleanup()


async def test_dripping_huge_and_gzip_receivers_delay_no_reap_and_grow_no_process(
    live_store: RunStore, db_url: str, tmp_path: Path
) -> None:
    store = live_store
    held = (await store.enqueue("default", "victim-tenant", {"steps": [{"sleep": 600}]})).run.id
    with receivers() as ports:
        await store.set_webhook_hosts([HostRule("127.0.0.1", True, tuple(ports.values()))])
        async with victim(db_url, tmp_path, held) as dead_to_be:
            drips = [await finished_with_webhook(store, "acme", f"http://127.0.0.1:{ports['drip']}/")
                     for _ in range(6)]
            floods = [await finished_with_webhook(store, "globex",
                                                  f"http://127.0.0.1:{ports[kind]}/")
                      for kind in ("huge", "bomb")]
            fine = await finished_with_webhook(store, "initech", f"http://127.0.0.1:{ports['ok']}/")
            with RssPeak() as memory:
                async with running_worker(db_url, reaper_interval_s=REAPER_INTERVAL_S,
                                          leader_ttl_s=5, lease_s=LEASE_S,
                                          webhook_deadline_s=20,
                                          drain_grace_s=1) as leader:
                    hooks = leader.webhooks
                    assert isinstance(hooks, WebhookDispatcher)

                    async def state(run_id: UUID) -> str:
                        found = await store.webhook(run_id)
                        assert found is not None
                        return str(found["state"])

                    async def others_delivered() -> bool:
                        return all([await state(r) == "delivered" for r in [*floods, fine]])
                    await until(others_delivered, timeout_s=15,
                                what="the other tenants' deliveries, beside acme's dripping")
                    # acme's dripping deliveries are under way, at most its
                    # bound at once; the others were not held behind them.
                    assert hooks.in_flight_by_tenant() == {"acme": 4}
                    assert [await state(r) for r in drips] == ["waiting"] * 6

                    dead_to_be.kill9()
                    killed = time.monotonic()

                    async def reaped() -> bool:
                        rows = query(db_url, "SELECT status, locked_by FROM agent_runs "
                                             "WHERE id = %s", held)
                        return rows[0][0] != "leased" or not rows[0][1].startswith(
                            dead_to_be.identity_prefix)
                    await until(reaped, timeout_s=60,
                                what="the dead worker's lease reaped")
                    took = time.monotonic() - killed
                    print(f"reaped {took:.2f} s after kill -9 with {hooks.in_flight} "
                          "deliveries dripping")
                    assert took <= LEASE_S + REAPER_INTERVAL_S + 1, took
                    assert hooks.in_flight_by_tenant() == {"acme": 4}  # still dripping

                    async def drips_cut() -> bool:
                        found = [await store.webhook(r) for r in drips[:4]]
                        return all(f is not None and f["attempts"] for f in found)
                    await until(drips_cut, timeout_s=40, what="the deadline cutting the drips")
        growth = memory.peak - memory.base
        print(f"leader's peak memory grew by {growth / 2**20:.1f} MiB")
        assert growth < GROWTH_BOUND_BYTES, growth
    for run_id in floods:
        found = await store.webhook(run_id)
        assert found is not None
        assert found["attempts"][-1]["status_code"] == 200
    for run_id in drips[:4]:
        found = await store.webhook(run_id)
        assert found is not None
        # A class of error, and the delivery retried later: the receiver's
        # own delay, no one else's.
        assert (found["state"], found["attempts"][-1]["error"]) == ("waiting", "timeout")
