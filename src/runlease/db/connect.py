"""Connections and connection pools, configured one way everywhere.

Pooled connections are autocommit: each named statement is its own short
transaction unless a caller opens one. `prepare=False` turns server-side
prepared statements off for PgBouncer in transaction mode (older PgBouncer
cannot route them); LISTEN never goes through these connection pools.
"""

from __future__ import annotations

import logging
import select
from typing import Any, cast

from psycopg import AsyncConnection, OperationalError
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool
from pydantic_core import from_json

log = logging.getLogger(__name__)

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


def _has_input(conn: Conn) -> bool:
    """Whether bytes (or an EOF) wait on an idle connection's socket, without
    reading them: one poll(2), no round trip."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


class _CheckOnCheckout:
    """The connection pool's `check` callback: a connection is handed out only if it is
    alive, so the first request after a database restart does not get a
    connection the old server closed (a 503 with nothing wrong any more).

    An idle pooled connection receives nothing unless its server ended it
    (a shutdown's FATAL message, then EOF; or an RST): pooled connections
    never LISTEN. So a poll(2) of the socket decides without a round trip, and
    only a connection with input waiting pays for one (an empty query, which
    reads that input). When one is dead the others most likely are too (a restart):
    the whole idle set is checked at once, or psycopg_pool would find them one
    per checkout, backing off 1 s, 2 s, 4 s... between them.
    """

    def __init__(self) -> None:
        self.conn_pool: AsyncConnectionPool[Conn] | None = None

    async def __call__(self, conn: Conn) -> None:
        if conn.closed or conn.broken:
            raise OperationalError("the pooled connection is closed")
        if not _has_input(conn):
            return
        try:
            await AsyncConnectionPool.check_connection(conn)
        except OperationalError as exc:
            log.warning("pooled_connection_dead conn_pool=%s error=%s",
                        getattr(self.conn_pool, "name", "?"), str(exc).strip())
            if self.conn_pool is not None:
                await self.conn_pool.check()
            raise


def _fast_json(conn: Conn) -> None:
    # jsonb columns parsed by pydantic-core, not the json module: a thousand
    # enqueued runs' rows took 45 ms to fetch, 20 ms this way (the same
    # values: numbers, big ones included, and strings as json.loads reads them).
    set_json_loads(from_json, conn)


async def _configure(conn: Conn) -> None:
    _fast_json(conn)


async def _generic_plans(conn: Conn) -> None:
    # Planned once per connection, not at every call: the submit statement's
    # planning cost more than running it. A SET, not libpq `options`, so a
    # URL's own options (a search_path) are kept.
    _fast_json(conn)
    await conn.execute("SET plan_cache_mode = force_generic_plan")


def make_conn_pool(
    url: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    prepare: bool = True,
    application_name: str = "runlease",
    timeout_s: float = 10.0,
    generic_plans: bool = False,
) -> AsyncConnectionPool[Conn]:
    """A connection pool that is not open yet: `await conn_pool.open()` (or
    `async with conn_pool`).
    Connections are checked on checkout (`_CheckOnCheckout`). `generic_plans`:
    prepared statements keep one plan (plan_cache_mode=force_generic_plan)."""
    check = _CheckOnCheckout()
    conn_pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        kwargs=_kwargs(prepare, application_name),
        configure=_generic_plans if generic_plans and prepare else _configure,
        open=False,
        timeout=timeout_s,
        name=application_name,
        check=check,
    )
    check.conn_pool = conn_pool
    return conn_pool


async def connect(
    url: str, *, prepare: bool = True, application_name: str = "runlease"
) -> Conn:
    """One dedicated connection (a claim loop's, or a LISTEN session's)."""
    conn = await AsyncConnection.connect(url, **_kwargs(prepare, application_name))  # type: ignore[arg-type]
    _fast_json(cast(Conn, conn))
    return cast(Conn, conn)
