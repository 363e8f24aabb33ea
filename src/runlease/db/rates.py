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
        bounds.check_pool(pool)
        bounds.check_tenant(tenant_id)
        rows = await self._rows("tenant_submit_lock", {"pool": pool, "tenant": tenant_id}, conn)
        if not rows:
            return None
        limit = int(rows[0]["submits_per_minute"])
        now = self.clock.db_now() or datetime.now(UTC)
        recent = await self._rows("tenant_submits_recent", {
            "pool": pool, "tenant": tenant_id, "n": n, "limit": limit,
            "floor": _id_floor(now - timedelta(seconds=60) - _ID_FLOOR_MARGIN)}, conn)
        count, wait_s = int(recent[0]["recent"]), recent[0]["wait_s"]
        if count + n <= limit:
            return None
        if n > limit or wait_s is None:
            return 60.0  # more than a whole minute's worth: never at once
        return max(0.001, float(wait_s))
