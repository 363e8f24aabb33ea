"""The executor every store builds on: named statements, connections, fencing.

One place turns a statement name and its parameters into rows, lends a
connection (the caller's, or one from the connection pool), fences a worker
write by its lease, and translates psycopg errors into runlease's own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import DictRow, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from runlease import metrics
from runlease.clock import Clock, SystemClock
from runlease.core import bounds
from runlease.core.redact import DEFAULT_REDACTOR, Redactor
from runlease.db.channels import POOL_CHANNEL_PREFIX
from runlease.db.models import Lease
from runlease.db.pooler import PREPARED_HINT, prepared_failure
from runlease.db.queries import sql
from runlease.errors import DatabaseUnavailable, IncarnationEnded, LeaseLost, RunleaseError

Conn = AsyncConnection[DictRow]


# Stale writes not yet reported to the database, by pool: the next
# heartbeat of a worker of that pool takes them into its registry row, and
# the reaper's leader folds those into agent_run_pool_health.
_unreported: dict[str, int] = {}


def stale_writes(pool: str, n: int = 1) -> None:
    """A fenced write matched no row: its lease was gone."""
    metrics.child(metrics.STALE_WRITES, pool).inc(n)
    _unreported[pool] = _unreported.get(pool, 0) + n


def take_stale_writes(pool: str) -> int:
    """The pool's stale writes not reported yet, now counted as reported."""
    return _unreported.pop(pool, 0)


def untake_stale_writes(pool: str, n: int) -> None:
    """A heartbeat that carried n did not commit (as far as we know): report them again."""
    if n:
        _unreported[pool] = _unreported.get(pool, 0) + n


class Executor:
    """Runs named statements; the stores are its subclasses, one per concern."""

    def __init__(
        self,
        conn_pool: AsyncConnectionPool[Conn],
        *,
        clock: Clock | None = None,
        redactor: Redactor = DEFAULT_REDACTOR,
        max_input_bytes: int = bounds.DEFAULT_MAX_INPUT_BYTES,
        max_result_bytes: int = bounds.DEFAULT_MAX_INPUT_BYTES,
    ) -> None:
        self.conn_pool = conn_pool
        self.clock: Clock = clock or SystemClock()
        self.redactor = redactor
        self.max_input_bytes = max_input_bytes
        self.max_result_bytes = max_result_bytes

    @asynccontextmanager
    async def connection(self, conn: Conn | None = None) -> AsyncIterator[Conn]:
        """The given connection, or one from the connection pool; errors translated."""
        try:
            if conn is not None:
                yield conn
            else:
                async with self.conn_pool.connection() as pooled:
                    yield pooled
        except PoolTimeout as exc:
            raise DatabaseUnavailable(f"no database connection available: {exc}") from exc
        except psycopg.Error as exc:
            if exc.sqlstate == IncarnationEnded.SQLSTATE:
                raise IncarnationEnded("", exc.diag.message_primary) from exc
            if prepared_failure(exc):
                raise RunleaseError(f"database error: {str(exc).strip()}: {PREPARED_HINT}") \
                    from exc
            if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
                raise DatabaseUnavailable(str(exc).strip() or type(exc).__name__) from exc
            raise RunleaseError(f"database error: {str(exc).strip()}") from exc

    async def _rows(
        self, name: str, params: dict[str, Any], conn: Conn | None = None
    ) -> list[DictRow]:
        params.setdefault("now", self.clock.db_now())
        async with self.connection(conn) as c, c.cursor() as cur:
            await cur.execute(sql(name), params)
            return await cur.fetchall() if cur.description is not None else []

    async def _tuples(
        self, name: str, params: dict[str, Any], conn: Conn | None = None, *,
        names: tuple[str, ...] | None = None,
    ) -> list[tuple[Any, ...]]:
        """Like _rows, as plain tuples: for a hot path that builds its objects
        by position. With `names`, each tuple holds those columns in that
        order, found by name (the statement's own order costs nothing more)."""
        params.setdefault("now", self.clock.db_now())
        async with self.connection(conn) as c, c.cursor(row_factory=tuple_row) as cur:
            await cur.execute(sql(name), params)
            rows = await cur.fetchall()
            if names is not None and cur.description is not None:
                got = tuple(column.name for column in cur.description)
                if got != names:
                    at = [got.index(n) for n in names]
                    rows = [tuple(r[i] for i in at) for r in rows]
            return rows

    async def _fenced(self, name: str, lease: Lease, params: dict[str, Any],
                      conn: Conn | None) -> list[DictRow]:
        """A write fenced by the lease: zero rows means it is gone."""
        params |= {"id": lease.run_id, "epoch": lease.epoch, "worker": lease.worker,
                   "channel_prefix": POOL_CHANNEL_PREFIX}
        rows = await self._rows(name, params, conn)
        if not rows:
            stale_writes(lease.run.pool)
            raise LeaseLost(lease.run_id, lease.epoch)
        return rows

