"""Tenant rates and queue quotas: how long a tenant must wait before it may
submit more runs, and how many more it may have waiting (statements in
sql/rates.sql). The token rate is checked inside the claim.

Every path that enqueues for a tenant asks here first (`admit`): the API's
submits and batches, schedules' ticks (db/schedules.py) and child runs
(db/children.py), so no path walks around a limit."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

from runlease.core import bounds
from runlease.db.executor import Conn, Executor
from runlease.errors import RunleaseError

# Retry-After of a submit refused for the quota: waiting runs leave the
# queue as workers take them, at no rate the API can foresee.
QUEUE_FULL_RETRY_S = 10.0


class Throttled(RunleaseError):
    """A submit refused by a tenant's limit: `code` rate_limited (its submit
    rate) or queue_full (its quota of waiting runs); `retry_s` the wait."""

    def __init__(self, code: str, tenant_id: str, pool: str, retry_s: float,
                 quota: int | None = None) -> None:
        what = (f"over its submit rate in pool {pool!r}" if code == "rate_limited" else
                f"at its quota of {quota} waiting runs in pool {pool!r}")
        super().__init__(f"tenant {tenant_id!r} is {what}")
        self.code = code
        self.tenant_id = tenant_id
        self.pool = pool
        self.retry_s = retry_s


@dataclass(frozen=True, slots=True)
class Room:
    """How many of the runs asked for a (pool, tenant) may go in now, and
    why the others may not."""

    n: int
    refusal: Throttled | None = None

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

    async def queue_room(self, pool: str, tenant_id: str, n: int, *,
                         conn: Conn) -> tuple[int, int | None]:
        """How many of n more runs fit under the tenant's quota of waiting
        runs in the pool, and the quota (None: none). Not locked: submits
        in flight together may pass it by as many as they are."""
        rows = await self._rows("tenant_queue_room", {"pool": pool, "tenant": tenant_id}, conn)
        if not rows or rows[0]["quota"] is None:
            return n, None
        quota = int(rows[0]["quota"])
        return max(0, min(n, quota - int(rows[0]["waiting"]))), quota

    async def admit(self, pool: str, tenant_id: str, n: int = 1, *, conn: Conn) -> Room:
        """How many of n runs, in order, the tenant's submit rate and queue
        quota let in now (in the transaction that enqueues them: see
        submit_room for the rate's lock)."""
        room, wait_s = await self.submit_room(pool, tenant_id, n, conn=conn)
        refusal = Throttled("rate_limited", tenant_id, pool, wait_s) if room < n else None
        if room > 0:
            fits, quota = await self.queue_room(pool, tenant_id, room, conn=conn)
            if fits < room:
                room = fits
                refusal = Throttled("queue_full", tenant_id, pool, QUEUE_FULL_RETRY_S, quota)
        return Room(room, refusal)

    async def admit_all(self, pool: str, tenant_id: str, n: int = 1, *, conn: Conn) -> None:
        """All n runs (a batch), or Throttled."""
        wait_s = await self.submit_wait(pool, tenant_id, n, conn=conn)
        if wait_s is not None:
            raise Throttled("rate_limited", tenant_id, pool, wait_s)
        fits, quota = await self.queue_room(pool, tenant_id, n, conn=conn)
        if fits < n:
            raise Throttled("queue_full", tenant_id, pool, QUEUE_FULL_RETRY_S, quota)

    async def key_taken(self, pool: str, tenant_id: str, key: str, *, conn: Conn) -> bool:
        """A run of the tenant's in the pool has this idempotency key."""
        rows = await self._rows("run_key_taken", {"pool": pool, "tenant": tenant_id,
                                                  "key": key}, conn)
        return bool(rows[0]["taken"])
