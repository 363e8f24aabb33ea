"""Connections and pools, configured one way everywhere.

Pooled connections are autocommit: each named statement is its own short
transaction unless a caller opens one. `prepare=False` turns server-side
prepared statements off for PgBouncer in transaction mode (older PgBouncer
cannot route them); LISTEN never goes through these pools.
"""

from __future__ import annotations

from typing import Any, cast

from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

Conn = AsyncConnection[DictRow]

# psycopg's default: prepare a statement after it ran this many times.
PREPARE_THRESHOLD = 5

# A cut network must surface as an error within seconds, not after the
# kernel's 15-minute retransmission timeout: a worker that cannot renew must
# know it, and a LISTEN session must reconnect.
_KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
    "connect_timeout": 5,
}


def _kwargs(prepare: bool, application_name: str) -> dict[str, object]:
    return {
        "autocommit": True,
        "row_factory": dict_row,
        "prepare_threshold": PREPARE_THRESHOLD if prepare else None,
        "application_name": application_name,
        **_KEEPALIVES,
    }


def make_pool(
    url: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    prepare: bool = True,
    application_name: str = "runlease",
    timeout_s: float = 10.0,
) -> AsyncConnectionPool[Conn]:
    """A pool that is not open yet: `await pool.open()` (or `async with pool`)."""
    pool = AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        kwargs=_kwargs(prepare, application_name),
        open=False,
        timeout=timeout_s,
        name=application_name,
    )
    return cast(AsyncConnectionPool[Conn], pool)


async def connect(
    url: str, *, prepare: bool = True, application_name: str = "runlease"
) -> Conn:
    """One dedicated connection (a claim loop's, or a LISTEN session's)."""
    conn = await AsyncConnection.connect(url, **_kwargs(prepare, application_name))  # type: ignore[arg-type]
    return cast(Conn, conn)
