"""Tenant submit rates and queue quotas at the API: a submit over the
tenant's submits_per_minute in the pool, or past its quota of waiting runs,
is a 429 (rate_limited, queue_full) with Retry-After, and nothing is
written. The check and the insert share one transaction (see
RateStore.submit_wait), so concurrent submits cannot pass the rate together."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from runlease.api.errors import ErrorAnswer
from runlease.db.rates import Throttled
from runlease.db.store import Conn, RunStore


def rate_limited(tenant_id: str, pool: str, wait_s: float) -> ErrorAnswer:
    return throttled(Throttled("rate_limited", tenant_id, pool, wait_s))


def throttled(exc: Throttled) -> ErrorAnswer:
    retry = max(1, math.ceil(exc.retry_s))
    return ErrorAnswer(429, exc.code, f"{exc}; retry in {retry} s", "pool",
                       headers={"Retry-After": str(retry)})


@asynccontextmanager
async def submit_slots(store: RunStore,
                       wanted: Mapping[tuple[str, str], int]) -> AsyncIterator[Conn]:
    """A transaction in which each (pool, tenant) may submit its count of
    runs: enqueue on the connection it yields. Raises the 429 instead (the
    first rate passed, in one order, so two batches never wait on each other
    in a cycle)."""
    async with store.connection() as conn, conn.transaction():
        for (pool, tenant_id), n in sorted(wanted.items()):
            try:
                await store.admit_all(pool, tenant_id, n, conn=conn)
            except Throttled as exc:
                raise throttled(exc) from None
        yield conn


def submit_slot(store: RunStore, pool: str, tenant_id: str,
                n: int = 1) -> AbstractAsyncContextManager[Conn]:
    """submit_slots for one pool and tenant."""
    return submit_slots(store, {(pool, tenant_id): n})
