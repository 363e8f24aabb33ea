"""A claimer process for the threads' kill -9 test (tests/integration/
test_thread_kill9.py): its own worker incarnation, beating every loop,
claiming a few runs at a time, holding them a moment, acking them; killed
with SIGKILL by the test at any point. Module-level, so a spawned process
can import it."""

from __future__ import annotations

import asyncio
import contextlib
import time

from runlease.db.connect import make_conn_pool
from runlease.db.models import Lease
from runlease.db.store import Registration, RunStore
from runlease.errors import LeaseLost

LEASE_S = 2


def claim_until(db_url: str, name: str, seconds: float) -> None:
    asyncio.run(_claim_until(db_url, name, time.monotonic() + seconds))


async def _claim_until(db_url: str, name: str, deadline: float) -> None:
    async with make_conn_pool(db_url, max_size=1) as conn_pool:
        store = RunStore(conn_pool)
        reg = Registration(name, "default", 0)
        await store.register_worker(reg, lease_s=LEASE_S)
        while time.monotonic() < deadline:
            if await store.heartbeat(reg, lease_s=LEASE_S) is None:
                return  # reaped: this incarnation is over
            leases = await store.claim("default", name, 2)
            if not leases:
                await asyncio.sleep(0.01)
                continue
            await _check_order(store, leases)
            await asyncio.sleep(0.25)  # the work: long enough for a kill to land on it
            for lease in leases:
                with contextlib.suppress(LeaseLost):  # reaped meanwhile: not ours any more
                    await store.ack(lease)


async def _check_order(store: RunStore, leases: list[Lease]) -> None:
    """Once the claim committed: a claimed run whose thread has an earlier
    run not finished started out of order; noted in the test's table."""
    async with store.connection() as conn:
        await conn.execute(
            "INSERT INTO test_out_of_order (run_id)"
            " SELECT m.id FROM agent_runs m"
            "  WHERE m.id = ANY(%s) AND EXISTS ("
            "        SELECT 1 FROM agent_runs r WHERE r.tenant_id = m.tenant_id"
            "           AND r.thread_id = m.thread_id AND r.thread_seq < m.thread_seq"
            "           AND r.finished_at IS NULL)",
            ([le.run_id for le in leases],))
