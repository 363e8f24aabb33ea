"""Reads the web console needs beyond the API's (statements in
sql/console.sql): bounded status counts, search by idempotency key, and a
run's lifecycle events."""

from __future__ import annotations

from uuid import UUID

from runlease.core import bounds
from runlease.db.executor import Conn, Executor
from runlease.db.models import Event, Run
from runlease.errors import ValidationError

STATUS_COUNT_CAP = 1000
MAX_LIFECYCLE = 200


class ConsoleStore(Executor):
    """Console reads; every one tenant-scoped when given a tenant."""

    async def status_counts(
        self, *, tenant_id: str | None = None, pool: str | None = None,
        cap: int = STATUS_COUNT_CAP, conn: Conn | None = None,
    ) -> dict[str, int]:
        """Runs per status, each counted up to cap + 1 (more than cap: "cap+")."""
        if not 1 <= cap <= 100_000:
            raise ValidationError("cap", "must be between 1 and 100000")
        rows = await self._rows("console_status_counts",
                                {"tenant": tenant_id, "pool": pool, "cap": cap}, conn)
        return {r["status"]: int(r["n"]) for r in rows}

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
