"""Reads the web console needs beyond the API's (statements in
sql/console.sql): bounded status counts, search by idempotency key, and a
run's lifecycle events."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from runlease.core import bounds
from runlease.db.executor import Conn, Executor
from runlease.db.models import Event, Run
from runlease.errors import ValidationError

STATUS_COUNT_WINDOW = 10_000
MAX_LIFECYCLE = 200


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Runs per status among the newest `window` runs; window_full: there
    may be older runs, not counted."""

    by_status: dict[str, int]
    window: int
    window_full: bool


class ConsoleStore(Executor):
    """Console reads; every one tenant-scoped when given a tenant."""

    async def status_counts(
        self, *, tenant_id: str | None = None, pool: str | None = None,
        window: int = STATUS_COUNT_WINDOW, conn: Conn | None = None,
    ) -> StatusCounts:
        """Runs per status among the newest `window` runs of the tenant (or of
        all), then of the pool: bounded work, polled by the console."""
        if not 1 <= window <= 100_000:
            raise ValidationError("window", "must be between 1 and 100000")
        rows = await self._rows(
            "console_status_counts" if tenant_id is None else "console_status_counts_tenant",
            {"tenant": tenant_id, "pool": pool, "window": window}, conn)
        return StatusCounts({r["status"]: int(r["n"]) for r in rows}, window,
                            window_full=bool(rows) and int(rows[0]["seen"]) >= window)

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
