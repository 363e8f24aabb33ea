"""The workers registry: a worker's row appears at start, is renewed by the
heartbeat statement that renews its leases, and goes at a clean shutdown;
the reaper's leader deletes rows expired long ago."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from psycopg.rows import DictRow

from runlease.clock import ManualClock
from runlease.db.models import Pool
from runlease.db.store import Conn, NewRun, Registration, RunStore
from runlease.errors import SettingsError, ValidationError
from runlease.settings import WorkerSettings, load
from runlease.worker.worker import Worker
from tests.support import agents
from tests.support.waiting import until
from tests.support.workers import running_worker


class CountingStore(RunStore):
    """The store, recording the named statements it sends."""

    def __init__(self, *args: Any, sent: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent = sent

    async def _rows(self, name: str, params: dict[str, Any], conn: Conn | None = None
                    ) -> list[DictRow]:
        self.sent.append(name)
        return await super()._rows(name, params, conn)


async def test_register_list_and_deregister(store: RunStore, clock: ManualClock) -> None:
    await store.upsert_pool(Pool("gpu"))
    row = await store.register_worker(Registration("pod-a:boot:1", "default", 8), lease_s=30)
    assert (row.id, row.pool, row.concurrency, row.runs_held, row.alive) == (
        "pod-a:boot:1", "default", 8, 0, True)
    assert row.version
    assert (row.expires_at - row.heartbeat_at).total_seconds() == 30
    await store.register_worker(Registration("pod-b:boot:1", "gpu", 2), lease_s=30)
    assert [w.id for w in await store.list_workers()] == ["pod-a:boot:1", "pod-b:boot:1"]
    assert [w.id for w in await store.list_workers("gpu")] == ["pod-b:boot:1"]
    clock.advance(31)
    (a,) = await store.list_workers("default")
    assert not a.alive
    await store.deregister_worker("pod-a:boot:1")
    assert [w.id for w in await store.list_workers()] == ["pod-b:boot:1"]


async def test_bad_registrations_are_refused(store: RunStore) -> None:
    with pytest.raises(ValidationError):
        await store.register_worker(Registration("x" * 256, "default", 1), lease_s=30)
    with pytest.raises(ValidationError):
        await store.register_worker(Registration("w", "default", -1), lease_s=30)
    with pytest.raises(ValidationError):
        await store.list_workers(limit=0)
    assert await store.list_workers() == []


async def test_the_heartbeat_renews_the_row_in_the_same_statement(
    store: RunStore, clock: ManualClock
) -> None:
    reg = Registration("pod-a:boot:1", "default", 4)
    await store.register_worker(reg, lease_s=30)
    await store.enqueue_many("default", [NewRun("acme", {}) for _ in range(3)])
    leases = await store.claim("default", reg.worker, 3)
    clock.advance(10)
    sent: list[str] = []
    counting = CountingStore(store.conn_pool, clock=clock, sent=sent)
    result = await counting.heartbeat(reg.worker, [(x.run_id, x.epoch) for x in leases[:2]],
                                      lease_s=30, registry=reg)
    assert len(result.held) == 2
    assert sent == ["run_heartbeat"]  # one round trip renews both
    (row,) = await store.list_workers()
    assert row.runs_held == 2
    assert row.heartbeat_at == clock.db_now()
    assert (row.expires_at - row.heartbeat_at).total_seconds() == 30
    # Holding nothing, the keeper renews the row alone.
    clock.advance(10)
    await store.heartbeat(reg.worker, [], lease_s=30, registry=reg)
    (row,) = await store.list_workers()
    assert (row.runs_held, row.heartbeat_at) == (0, clock.db_now())


async def test_a_heartbeat_brings_back_a_deleted_row(store: RunStore, clock: ManualClock) -> None:
    reg = Registration("pod-a:boot:1", "default", 4)
    await store.register_worker(reg, lease_s=30)
    clock.advance(100)
    assert await store.delete_stale_workers(60) == [("pod-a:boot:1", "default")]
    assert await store.list_workers() == []
    await store.heartbeat(reg.worker, [], lease_s=30, registry=reg)
    (row,) = await store.list_workers()
    assert row.alive


async def test_stale_rows_are_deleted_only_past_the_bound(
    store: RunStore, clock: ManualClock
) -> None:
    await store.register_worker(Registration("old", "default", 1), lease_s=10)
    clock.advance(50)
    await store.register_worker(Registration("new", "default", 1), lease_s=10)
    clock.advance(20)  # old expired 60 s ago, new 10 s ago
    assert await store.delete_stale_workers(30) == [("old", "default")]
    assert [w.id for w in await store.list_workers()] == ["new"]


async def test_a_worker_registers_at_start_and_leaves_at_a_clean_stop(
    live_store: RunStore, db_url: str
) -> None:
    run = await live_store.enqueue("default", "acme", {"sleep": 60})
    async with running_worker(db_url, agents.sleepy, concurrency=3) as worker:
        (row,) = await live_store.list_workers("default")
        assert (row.id, row.concurrency, row.alive) == (worker.identity, 3, True)
        first = row.heartbeat_at

        async def renewed_holding_one() -> bool:
            (r,) = await live_store.list_workers()
            return r.heartbeat_at > first and r.runs_held == 1

        await until(renewed_holding_one, timeout_s=10, what="a heartbeat holding the run")
        await live_store.request_cancel(run.run.id)
        await asyncio.sleep(0)
    assert await live_store.list_workers() == []


def test_an_identity_the_registry_cannot_hold_is_refused_at_construction(db_url: str) -> None:
    # Otherwise every heartbeat (which renews the registry row) would fail,
    # and every run would be fenced.
    settings = load(WorkerSettings, {"agent": "runlease.agents.script:agent",
                                     "database_url": db_url}, environ={})
    with pytest.raises(SettingsError, match="identity"):
        Worker(settings, identity="x" * 256, handle_signals=False, seal_environ=False)
