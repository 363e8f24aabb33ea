"""runlease_notify_freed (migration 0007): each transition that ends a lease
(ack, nack, fail, finalize_cancel) NOTIFYs a pool with tenant limits, so a
claimer waiting on a capped tenant claims at once; a pool without limits
gets nothing from them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
import pytest

from runlease.db.channels import pool_channel
from runlease.db.models import Lease, Pool
from runlease.db.store import RunStore

ENDS: dict[str, Callable[[RunStore, Lease], Awaitable[object]]] = {
    "ack": lambda store, lease: store.ack(lease, {"ok": True}),
    "nack": lambda store, lease: store.nack(lease, "flaky", "try again"),
    "fail": lambda store, lease: store.fail(lease, "fatal", "no"),
    "finalize_cancel": lambda store, lease: store.finalize_cancel(lease),
}


async def payloads(conn: psycopg.AsyncConnection[object], n: int) -> AsyncIterator[str]:
    async with asyncio.timeout(5):
        async for notify in conn.notifies():
            yield notify.payload
            n -= 1
            if not n:
                return


async def ended(store: RunStore, pool: str, end: str) -> Lease:
    await store.enqueue(pool, "acme", {})
    (lease,) = await store.claim(pool, "w1", 1)
    if end == "finalize_cancel":
        await store.request_cancel(lease.run_id)
    return lease


@pytest.mark.parametrize("end", list(ENDS))
async def test_a_freed_slot_wakes_a_pool_with_tenant_limits(store: RunStore, db_url: str,
                                                            end: str) -> None:
    await store.upsert_pool(Pool("capped", default_max_in_flight=2))
    lease = await ended(store, "capped", end)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute(f'LISTEN "{pool_channel("capped")}"')
        await ENDS[end](store, lease)
        assert [p async for p in payloads(listener, 1)] == ["capped"]


@pytest.mark.parametrize("end", list(ENDS))
async def test_a_pool_without_limits_is_not_woken(store: RunStore, db_url: str,
                                                  end: str) -> None:
    lease = await ended(store, "default", end)
    channel = pool_channel("default")
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute(f'LISTEN "{channel}"')
        await ENDS[end](store, lease)
        # Notifications arrive in commit order: a marker sent after the
        # transition committed comes first only if the transition sent none.
        await listener.execute("SELECT pg_notify(%s, 'marker')", (channel,))
        assert [p async for p in payloads(listener, 1)] == ["marker"]
