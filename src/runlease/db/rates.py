"""Tenant rates: how long a tenant must wait before it may submit more runs
(statements in sql/rates.sql). The token rate is checked inside the claim."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from runlease.core import bounds
from runlease.db.executor import Conn, Executor

# Run ids are UUIDv7 minted by the enqueuing process: the floor leaves room
# for that process's clock to be off from the database's.
_ID_FLOOR_MARGIN = timedelta(minutes=5)


def _id_floor(at: datetime) -> UUID:
    """The smallest UUIDv7 of the millisecond `at`."""
    ms = int(at.timestamp() * 1000)
    return UUID(int=(ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | 0b10 << 62)


class RateStore(Executor):
    async def submit_wait(self, pool: str, tenant_id: str, n: int = 1, *,
                          conn: Conn) -> float | None:
        """None if the tenant may submit n more runs to the pool now; else the
        seconds until it may. Call it in the transaction that enqueues: a rated
        tenant's submits are serialised by a lock held until its commit."""
        limit = await self._lock_rate(pool, tenant_id, conn)
        if limit is None:
            return None
        count, wait_s = await self._recent(pool, tenant_id, n, limit, conn)
        if count + n <= limit:
            return None
        if n > limit or wait_s is None:
            return 60.0  # more than a whole minute's worth: never at once
        return max(0.001, wait_s)

    async def submit_room(self, pool: str, tenant_id: str, n: int, *,
                          conn: Conn) -> tuple[int, float]:
        """How many of n runs, one request each, the tenant may submit to the
        pool now, and for the others the seconds until one more may. Locks as
        submit_wait does; called again in the same transaction, it counts what
        that transaction enqueued meanwhile."""
        limit = await self._lock_rate(pool, tenant_id, conn)
        if limit is None:
            return n, 0.0
        count, wait_s = await self._recent(pool, tenant_id, 1, limit, conn)
        room = max(0, min(n, limit - count))
        if 0 < room < n:  # the wait for one more than fits
            wait_s = (await self._recent(pool, tenant_id, room + 1, limit, conn))[1]
        return room, 60.0 if wait_s is None else max(0.001, wait_s)

    async def _lock_rate(self, pool: str, tenant_id: str, conn: Conn) -> int | None:
        """The tenant's submits_per_minute in the pool (None: no rate), its
        submit lock taken when it has one."""
        bounds.check_pool(pool)
        bounds.check_tenant(tenant_id)
        rows = await self._rows("tenant_submit_lock", {"pool": pool, "tenant": tenant_id}, conn)
        return int(rows[0]["submits_per_minute"]) if rows else None

    async def _recent(self, pool: str, tenant_id: str, n: int, limit: int,
                      conn: Conn) -> tuple[int, float | None]:
        """Runs submitted in the last minute, and the seconds until n more fit."""
        now = self.clock.db_now() or datetime.now(UTC)
        recent = await self._rows("tenant_submits_recent", {
            "pool": pool, "tenant": tenant_id, "n": n, "limit": limit,
            "floor": _id_floor(now - timedelta(seconds=60) - _ID_FLOOR_MARGIN)}, conn)
        wait_s = recent[0]["wait_s"]
        return int(recent[0]["recent"]), None if wait_s is None else float(wait_s)
