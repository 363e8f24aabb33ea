"""Whether a database URL leads through a transaction-pooling proxy (PgBouncer
with pool_mode = transaction), where session state does not outlive a
transaction: server-side prepared statements then fail at random.

PgBouncer before 1.21 (and later ones with max_prepared_statements = 0) hands
a client's next transaction to whichever server connection is free, so a
statement prepared on one is missing on the next ("prepared statement
_pg3_0 does not exist") or clashes with another client's of the same name
("... already exists"). A worker (and `runlease api`) refuses to start in that
setup with prepared statements on (`check_behind_pooler`), and a statement that
fails that way anyway says what to change (`PREPARED_HINT`).
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
from psycopg import errors as pg_errors

from runlease.db.connect import Conn, connect
from runlease.errors import SettingsError

log = logging.getLogger(__name__)

PREPARED_HINT = (
    "server-side prepared statements do not survive between transactions here, as "
    "behind PgBouncer in transaction pooling mode: turn them off with "
    "--no-prepared-statements (RUNLEASE_PREPARED_STATEMENTS=false), or use PgBouncer "
    ">= 1.21 with max_prepared_statements > 0"
)



def prepared_failure(exc: BaseException) -> bool:
    """Whether exc is a prepared statement gone missing, collided with another
    client's of the same name, or (worst) bound to another client's statement
    of that name: the server then refuses the parameters (a protocol violation,
    08P01), or would run the wrong statement if they happened to fit, which is
    why a worker or the API refuses to start in that setup."""
    if isinstance(exc, pg_errors.InvalidSqlStatementName | pg_errors.DuplicatePreparedStatement):
        return True
    return (isinstance(exc, psycopg.Error) and exc.sqlstate == "08P01"
            and "prepared statement" in str(exc))


async def _backend(conn: Conn) -> int:
    cur = await conn.execute("SELECT pg_backend_pid() AS pid")
    row = await cur.fetchone()
    assert row is not None
    return int(row["pid"])


async def transaction_pooled(url: str) -> bool:
    """True when two client connections share a server backend, or one client
    connection's backend changes between its transactions: both happen only
    behind a transaction pooler. A pooler with one server connection may hide
    it (no false positives: a direct or session-pooled URL never does either)."""
    a = await connect(url, prepare=False, application_name="runlease-pooler-probe")
    try:
        b = await connect(url, prepare=False, application_name="runlease-pooler-probe")
        try:
            first = await _backend(a)
            async with b.transaction():
                # Holds a server connection: a LIFO pooler lends b the one a
                # just gave back, and must then move a to another.
                other = await _backend(b)
                second_task = asyncio.ensure_future(_backend(a))
                await asyncio.wait({second_task}, timeout=1.0)
            second = await second_task
            return other == first or second != first
        finally:
            await b.close()
    finally:
        await a.close()


async def check_behind_pooler(url: str, *, prepared: bool, listen: bool) -> None:
    """At a worker's or the API's start: with prepared statements on, a transaction-pooled
    `url` is a SettingsError; with LISTEN on that URL (no separate listen URL),
    a warning, since its NOTIFYs never arrive and claims fall back to polling.
    A probe that cannot reach the database decides nothing (the statements'
    own errors then carry PREPARED_HINT)."""
    if not (prepared or listen):
        return
    try:
        pooled = await transaction_pooled(url)
    except psycopg.Error as exc:
        log.warning("pooler_probe_failed error=%s", str(exc).strip())
        return
    if not pooled:
        return
    if prepared:
        raise SettingsError(f"--prepared-statements (RUNLEASE_PREPARED_STATEMENTS): the "
                            f"database URL is transaction pooled: {PREPARED_HINT}")
    log.warning("listen_through_pooler: the database URL is transaction pooled, where "
                "LISTEN receives no NOTIFY; give --listen-database-url "
                "(RUNLEASE_LISTEN_DATABASE_URL) a direct URL, or --no-listen: until then "
                "claims wait for the poll interval")
