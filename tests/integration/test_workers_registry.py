"""The workers registry: one row per worker incarnation, which is the lease
of every run it holds. It appears at start, one heartbeat statement renews
it, a clean shutdown ends it (an ended or deleted incarnation never renews
again), and the reaper's leader deletes rows over long ago."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from psycopg.rows import DictRow

from runlease.clock import ManualClock
from runlease.db.models import Pool
from runlease.db.store import Conn, NewRun, Registration, RunStore
from runlease.errors import RunleaseError, SettingsError, ValidationError
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
    await store.deregister_worker("pod-b:boot:1")
    (b,) = await store.list_workers("gpu")
    assert (b.alive, b.ended_at) == (False, clock.db_now())
    assert await store.heartbeat(Registration("pod-b:boot:1", "gpu", 2), lease_s=30) is None
    clock.advance(31)
    (a,) = await store.list_workers("default")
    assert (a.alive, a.ended_at) == (False, None)  # expired, not ended yet
    # An id is never registered twice.
    with pytest.raises(RunleaseError, match="never reused"):
        await store.register_worker(Registration("pod-a:boot:1", "default", 8), lease_s=30)


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
    renewal = await counting.heartbeat(reg, lease_s=30, runs_held=3)
    assert renewal is not None
    assert sent == ["worker_heartbeat"]  # one round trip renews all three
    (row,) = await store.list_workers()
    assert row.runs_held == 3
    assert row.heartbeat_at == clock.db_now()
    assert (row.expires_at - row.heartbeat_at).total_seconds() == 30
    assert renewal.expires_at == row.expires_at
    for lease in leases:  # each run's lease is its holder's
        assert (await store.get(lease.run_id)).locked_until == row.expires_at
    # Holding nothing, the keeper renews the row all the same.
    clock.advance(10)
    assert await store.heartbeat(reg, lease_s=30) is not None
    (row,) = await store.list_workers()
    assert (row.runs_held, row.heartbeat_at) == (0, clock.db_now())


async def test_an_expired_or_deleted_incarnation_never_renews(
    store: RunStore, clock: ManualClock
) -> None:
    # Its runs may have been requeued and claimed by others already: a
    # renewal coming back would make two holders of one run.
    reg = Registration("pod-a:boot:1", "default", 4)
    await store.register_worker(reg, lease_s=30)
    clock.advance(31)
    assert await store.heartbeat(reg, lease_s=30) is None
    clock.advance(100)
    assert await store.delete_stale_workers(60) == [("pod-a:boot:1", "default")]
    assert await store.list_workers() == []
    assert await store.heartbeat(reg, lease_s=30) is None
    assert await store.list_workers() == []


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
        assert (row.concurrency, row.alive) == (3, True)
        assert row.id.startswith(worker.identity + ":")
        first = row.heartbeat_at

        async def renewed_holding_one() -> bool:
            (r,) = await live_store.list_workers()
            return r.heartbeat_at > first and r.runs_held == 1

        await until(renewed_holding_one, timeout_s=10, what="a heartbeat holding the run")
        await live_store.request_cancel(run.run.id)
        await asyncio.sleep(0)
    (gone,) = await live_store.list_workers()
    assert (gone.id, gone.alive) == (row.id, False)
    assert gone.ended_at is not None


def test_an_identity_the_registry_cannot_hold_is_refused_at_construction(db_url: str) -> None:
    # Otherwise every heartbeat (which renews the registry row) would fail,
    # and every run would be fenced.
    settings = load(WorkerSettings, {"agent": "runlease.agents.script:agent",
                                     "database_url": db_url}, environ={})
    with pytest.raises(SettingsError, match="identity"):
        Worker(settings, identity="x" * 256, handle_signals=False, seal_environ=False)
