"""Reads the web console needs beyond the API's (statements in
sql/console.sql): status counts from the maintained counts, search by
idempotency key, and a run's holders and lifecycle events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from runlease.core import bounds
from runlease.db.executor import Conn, Executor
from runlease.db.models import Event, Run

MAX_LIFECYCLE = 200
SHOWN = ("pending", "leased", "waiting", "done", "dead", "cancelled")


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Runs per status over every run of the scope (a tenant, a pool, both
    or all), from the maintained counts; `delayed`: the pending ones in
    backoff or scheduled for later."""

    by_status: dict[str, int]
    delayed: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


class ConsoleStore(Executor):
    """Console reads; every one tenant-scoped when given a tenant."""

    async def sign_out(self, nonce: str, expires: int, *, conn: Conn | None = None) -> None:
        """The console session with this nonce is over, though its cookie
        (stateless, signed) would be valid until `expires` (unix seconds)."""
        await self._rows("console_signout_add", {"nonce": nonce[:64], "expires": expires}, conn)

    async def signed_out(self, nonce: str, *, conn: Conn | None = None) -> bool:
        rows = await self._rows("console_signed_out", {"nonce": nonce[:64]}, conn)
        return bool(rows[0]["out"])

    async def status_counts(
        self, *, tenant_id: str | None = None, pool: str | None = None,
        conn: Conn | None = None,
    ) -> StatusCounts:
        """Runs per status of the tenant (or of all), and of the pool: the
        maintained counts (rows per pool, tenant and state, never the runs)
        plus the leased runs; done runs are the total less the others.
        Statuses with no run are left out."""
        rows = await self._rows("console_status_counts", {"tenant": tenant_id, "pool": pool},
                                conn)
        n = {r["state"]: int(r["n"] or 0) for r in rows}
        delayed = n.get("delayed", 0)
        counts = {"pending": n.get("pending", 0) + delayed, "leased": n.get("leased", 0),
                  "waiting": n.get("waiting", 0), "dead": n.get("dead", 0),
                  "cancelled": n.get("cancelled", 0)}
        counts["done"] = max(0, n.get("total", 0) - sum(counts.values()))
        return StatusCounts({s: counts[s] for s in SHOWN if counts[s]}, delayed)

    async def holders(self, run_id: UUID, *, conn: Conn | None = None) -> list[dict[str, Any]]:
        """Who held each of the run's last leases, oldest first: worker,
        attempt, at (when claimed) and seq (the run's event_seq then)."""
        rows = await self._rows("console_run_holders", {"id": run_id}, conn)
        value = rows[0]["holders"] if rows else []
        return [h for h in value if isinstance(h, dict)] if isinstance(value, list) else []

    async def runs_by_key(
        self, key: str, *, tenant_id: str | None = None, limit: int = 50,
        conn: Conn | None = None,
    ) -> list[Run]:
        bounds.check_idempotency_key(key)
        rows = await self._rows("console_runs_by_key",
                                {"key": key, "tenant": tenant_id, "limit": limit}, conn)
        return [Run.from_row(r) for r in rows]

    async def lifecycle(self, run_id: UUID, *, limit: int = MAX_LIFECYCLE,
                        conn: Conn | None = None) -> list[Event]:
        """The run's latest run.* events, oldest first (at most limit)."""
        rows = await self._rows("console_run_lifecycle", {"id": run_id, "limit": limit}, conn)
        return [Event.from_row({**r, "run_id": run_id}) for r in reversed(rows)]
