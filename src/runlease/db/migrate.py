"""Apply the numbered migrations in `sql/migrations/`, idempotently.

Safe when several pods run it at once: a session-level advisory lock
serializes migrators, and each migration is applied and recorded in one
transaction. An applied migration whose file has changed since is an error:
migrations are immutable once released.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import cast

import psycopg

from runlease.errors import DatabaseUnavailable, MigrationError

log = logging.getLogger(__name__)

# pg_advisory_lock key for migrators: "runlease" in ASCII, as a bigint.
MIGRATION_LOCK_KEY = 0x72756E6C65617365
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS runlease_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str = field(repr=False)

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def migrations() -> list[Migration]:
    """The migrations this version ships, in order, numbered 1, 2, 3... without gaps."""
    found: list[Migration] = []
    folder = resources.files("runlease.db").joinpath("sql", "migrations")
    for entry in folder.iterdir():
        match = _FILE_RE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, m in enumerate(found, start=1):
        if m.version != expected:
            raise MigrationError(f"migration numbers must run 1, 2, 3...: found {m.version}")
    return found


def _try_lock(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (MIGRATION_LOCK_KEY,)).fetchone()
    return bool(row and row[0])


def _applied(conn: psycopg.Connection[tuple[object, ...]]) -> dict[int, str]:
    rows = conn.execute("SELECT version, checksum FROM runlease_migrations").fetchall()
    return {cast(int, v): cast(str, c) for v, c in rows}


def _check_history(applied: dict[int, str], known: list[Migration]) -> None:
    by_version = {m.version: m for m in known}
    for version, checksum in sorted(applied.items()):
        m = by_version.get(version)
        if m is None:
            raise MigrationError(
                f"the database has migration {version}, which this runlease does not know: "
                "it was migrated by a newer version"
            )
        if m.checksum != checksum:
            raise MigrationError(f"migration {version} ({m.name}) changed after it was applied")


def migrate(
    url: str,
    *,
    lock_wait_log_s: float = 5.0,
    report: Callable[[str], None] = log.info,
) -> list[Migration]:
    """Apply what is missing; returns the migrations applied by this call."""
    known = migrations()
    try:
        conn = psycopg.connect(url, autocommit=True, application_name="runlease-migrate")
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(str(exc).strip()) from exc
    with conn:
        waited_since = time.monotonic()
        while not _try_lock(conn):
            if time.monotonic() - waited_since >= lock_wait_log_s:
                report("waiting for another migrator to finish")
                waited_since = time.monotonic()
            time.sleep(0.2)
        try:
            conn.execute(_CREATE_TABLE)
            applied = _applied(conn)
            _check_history(applied, known)
            done: list[Migration] = []
            for m in known:
                if m.version in applied:
                    continue
                report(f"applying migration {m.version:04d}_{m.name}")
                with conn.transaction():
                    conn.execute(m.sql)
                    conn.execute(
                        "INSERT INTO runlease_migrations (version, name, checksum)"
                        " VALUES (%s, %s, %s)",
                        (m.version, m.name, m.checksum),
                    )
                done.append(m)
            return done
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))


def pending(url: str) -> list[Migration]:
    """Migrations not applied yet (all of them on an empty database)."""
    known = migrations()
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('runlease_migrations') IS NOT NULL").fetchone()
        applied = _applied(conn) if exists and exists[0] else {}
    _check_history(applied, known)
    return [m for m in known if m.version not in applied]
