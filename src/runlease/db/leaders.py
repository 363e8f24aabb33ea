"""Leader election rows (statements in sql/leaders.sql)."""

from __future__ import annotations

from runlease.db.executor import Conn, Executor


class LeaderStore(Executor):
    """One row per role: acquire, renew and resign a term."""

    async def leader_acquire(
        self, name: str, me: str, ttl_s: float, *, conn: Conn | None = None
    ) -> int | None:
        """Take the role if nobody holds it live; returns the new term."""
        rows = await self._rows("leader_acquire", {"name": name, "me": me, "ttl_s": ttl_s},
                                conn)
        return int(rows[0]["term"]) if rows else None

    async def leader_renew(
        self, name: str, me: str, term: int, ttl_s: float, *, conn: Conn | None = None
    ) -> bool:
        rows = await self._rows(
            "leader_renew", {"name": name, "me": me, "term": term, "ttl_s": ttl_s}, conn
        )
        return bool(rows)

    async def leader_resign(
        self, name: str, me: str, term: int, *, conn: Conn | None = None
    ) -> None:
        await self._rows("leader_resign", {"name": name, "me": me, "term": term}, conn)
