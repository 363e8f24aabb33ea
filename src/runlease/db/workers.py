"""The workers registry: one row per worker incarnation, which is the lease
of every run it holds (statements in sql/workers.sql).

A worker registers an incarnation at start; its lease keeper renews that
one row (heartbeat), whatever the runs it holds: a run's lease lives while
its holder's incarnation does. An incarnation that is not renewed in time
is ended by the reaper, which requeues its runs; an ended incarnation never
renews again, so its worker stops every run it held and registers a new
one. A clean shutdown ends it; the reaper's leader deletes rows over long ago.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from runlease import __version__
from runlease.core import bounds
from runlease.db.executor import Conn, Executor, take_stale_writes, untake_stale_writes
from runlease.errors import RunleaseError, ValidationError

MAX_WORKER_ID_CHARS = 255
MAX_VERSION_CHARS = 64
MAX_WORKER_LIST = 1000


@dataclass(frozen=True, slots=True)
class Registration:
    """What a worker incarnation says about itself (`worker`: its id, the
    locked_by of every run it claims)."""

    worker: str
    pool: str
    concurrency: int
    version: str = __version__

    def params(self) -> dict[str, Any]:
        return {"worker": self.worker, "pool": self.pool, "concurrency": self.concurrency,
                "version": self.version[:MAX_VERSION_CHARS] or "unknown"}


@dataclass(frozen=True, slots=True)
class PoolService:
    """Whether a pool is served: `claimable`, one of its runs could be
    claimed now (pending and due, the pool not paused); `live_workers`, its
    registered workers alive by the database clock."""

    pool: str
    live_workers: int
    claimable: bool

    @property
    def unserved(self) -> bool:
        """Runs are waiting to be claimed and no live worker is there to."""
        return self.claimable and self.live_workers == 0


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One registered worker. `alive`: its row is unexpired by the database clock."""

    id: str
    pool: str
    version: str
    concurrency: int
    runs_held: int
    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    alive: bool
    ended_at: datetime | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> WorkerRow:
        return cls(id=row["id"], pool=row["pool"], version=row["version"],
                   concurrency=int(row["concurrency"]), runs_held=int(row["runs_held"]),
                   started_at=row["started_at"], heartbeat_at=row["heartbeat_at"],
                   expires_at=row["expires_at"], alive=bool(row["alive"]),
                   ended_at=row.get("ended_at"))


@dataclass(frozen=True, slots=True)
class Renewal:
    """A heartbeat that renewed its incarnation: the new expiry of every lease
    it holds, and its runs whose cancel was requested."""

    expires_at: datetime
    cancel_requested: frozenset[UUID] = frozenset()


@dataclass(frozen=True, slots=True)
class PoolHealth:
    """A pool's lease expiries and stale writes over a recent window."""

    lease_expiries: int = 0
    stale_writes: int = 0


def _check(reg: Registration, lease_s: int | None) -> None:
    if not 1 <= len(reg.worker) <= MAX_WORKER_ID_CHARS:
        raise ValidationError("worker", f"must be 1 to {MAX_WORKER_ID_CHARS} characters")
    if reg.concurrency < 0:
        raise ValidationError("concurrency", "must be 0 or more")
    if lease_s is not None:
        bounds.check_lease_s(lease_s)


class WorkerStore(Executor):
    """Registration, renewal and listing of worker processes."""

    async def register_worker(self, reg: Registration, *, lease_s: int,
                              conn: Conn | None = None) -> WorkerRow:
        """Register a new incarnation, live for lease_s from now. An id that
        was ever registered is refused (ids are never reused)."""
        _check(reg, lease_s)
        rows = await self._rows("worker_register", reg.params() | {"lease_s": lease_s}, conn)
        if not rows:
            raise RunleaseError(f"worker incarnation {reg.worker!r} was registered before: "
                                "an incarnation id is never reused")
        return WorkerRow.from_row(rows[0])

    async def heartbeat(self, reg: Registration, *, lease_s: int, runs_held: int = 0,
                        conn: Conn | None = None) -> Renewal | None:
        """Renew the incarnation, and with it every lease it holds, for
        lease_s from now; also reports the stale writes seen since the last
        beat. None: the incarnation is over (ended, or expired before this
        renewal): it holds nothing any more and may never renew again."""
        _check(reg, lease_s)
        stale = take_stale_writes(reg.pool)
        try:
            rows = await self._rows("worker_heartbeat", {
                "worker": reg.worker, "lease_s": lease_s, "runs_held": max(0, runs_held),
                "stale_writes": stale}, conn)
        except BaseException:
            untake_stale_writes(reg.pool, stale)
            raise
        if not rows:
            # Over: the stale writes wait for the next incarnation's beat.
            untake_stale_writes(reg.pool, stale)
            return None
        return Renewal(rows[0]["expires_at"], frozenset(rows[0]["cancel_requested"]))

    async def deregister_worker(self, worker: str, *, conn: Conn | None = None) -> None:
        """End the incarnation (a clean shutdown): it never renews again, and
        the reaper requeues what it may still hold."""
        await self._rows("worker_deregister", {"worker": worker}, conn)

    async def delete_stale_workers(self, after_s: float, *,
                                   conn: Conn | None = None) -> list[tuple[str, str]]:
        """Delete rows of incarnations over (ended or expired) more than
        after_s ago; returns (id, pool) of each."""
        rows = await self._rows("worker_delete_stale", {"after_s": after_s}, conn)
        return [(r["id"], r["pool"]) for r in rows]

    async def fold_stale_writes(self, *, conn: Conn | None = None) -> int:
        """Move the stale writes the workers reported into this minute's
        pool health rows (the reaper's leader); returns how many."""
        rows = await self._rows("pool_health_fold_stale", {}, conn)
        return int(rows[0]["n"])

    async def prune_pool_health(self, *, conn: Conn | None = None) -> None:
        """Delete pool health minutes older than a day (the reaper's leader)."""
        await self._rows("pool_health_prune", {}, conn)

    async def pool_health(self, window_s: float, pool: str | None = None, *,
                          conn: Conn | None = None) -> dict[str, PoolHealth]:
        """Lease expiries and stale writes per pool over the last window_s
        seconds (whole minutes); pools with neither are absent."""
        rows = await self._rows("pool_health_recent", {"window_s": window_s, "pool": pool},
                                conn)
        return {r["pool"]: PoolHealth(int(r["lease_expiries"]), int(r["stale_writes"]))
                for r in rows}

    async def list_workers(self, pool: str | None = None, *, limit: int = MAX_WORKER_LIST,
                           conn: Conn | None = None) -> list[WorkerRow]:
        """Registered worker incarnations (ended or expired rows not yet
        deleted included, with alive False), by pool then start time."""
        if not 1 <= limit <= MAX_WORKER_LIST:
            raise ValidationError("limit", f"must be between 1 and {MAX_WORKER_LIST}")
        rows = await self._rows("worker_list", {"pool": pool, "limit": limit}, conn)
        return [WorkerRow.from_row(r) for r in rows]

    async def pool_service(self, pool: str | None = None, *,
                           conn: Conn | None = None) -> dict[str, PoolService]:
        """Per pool (one, or all): claimable runs and live workers (PoolService)."""
        if pool is not None:
            bounds.check_pool(pool)
        rows = await self._rows("pool_service", {"pool": pool}, conn)
        return {r["pool"]: PoolService(r["pool"], int(r["live_workers"]), bool(r["claimable"]))
                for r in rows}
