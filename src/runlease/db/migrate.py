"""Apply the numbered migrations in `sql/migrations/`, then `sql/functions.sql`, idempotently.

The rule: a table, column, constraint, index or data change is a new numbered
migration; a function or trigger change is an edit of functions.sql (the
current definition of each, all CREATE OR REPLACE). The migrations pending
and then functions.sql are applied in one transaction, so a write never
meets a schema without its functions and triggers, and recorded there;
functions.sql alone is re-applied when its checksum differs from the
recorded one (row 0 of runlease_migrations). A start with nothing to do
takes no lock on any table.

Safe when several pods run it at once: a session-level advisory lock
serializes migrators. An applied migration whose file has changed since is
an error: migrations are immutable once released (but see _RELEASED).
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

# Function bodies left these migrations for functions.sql (issue 13): a
# database migrated before that recorded these checksums of their old text,
# which produced the same tables (tests/integration/test_schema.py upgrades
# databases migrated with the old files, kept in tests/fixtures/).
_RELEASED = {
    1: "14c279392d16f4d276d62c79d5bb394a4a7630eae17949b4899abfcb998cd9f7",
    4: "7c21f11d85b0e361977cff0cba165c3d387df3ee7e9bca2736f32db42c55c0df",
    6: "4fbf794f203db5f20f20dffa82912eedefa8c17ca4cdbd8f03dc2676948f06bd",
    7: "812c319057da555486c14148fdfa7200b1a80decf018a5996fe1447e6b9854ee",
    8: "5f16e4e9cbd51f16e58fc6c93eead5c364f0a7be6b742a8b40664256e82514c7",
    11: "2f6ec2c76e6c14490075fe8d865025f74956e6b0b1555dc2c24ad46861dfb593",
}
# The row of runlease_migrations that records functions.sql's checksum.
FUNCTIONS_VERSION = 0

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
    def file(self) -> str:
        """Its file's name under sql/."""
        if self.version == FUNCTIONS_VERSION:
            return "functions.sql"
        return f"migrations/{self.version:04d}_{self.name}.sql"

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


def functions() -> Migration:
    """sql/functions.sql: the current definition of every function and trigger."""
    sql = resources.files("runlease.db").joinpath("sql", "functions.sql").read_text(
        encoding="utf-8")
    return Migration(FUNCTIONS_VERSION, "functions", sql)


def _try_lock(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (MIGRATION_LOCK_KEY,)).fetchone()
    return bool(row and row[0])


def _applied(conn: psycopg.Connection[tuple[object, ...]]) -> dict[int, str]:
    rows = conn.execute("SELECT version, checksum FROM runlease_migrations").fetchall()
    return {cast(int, v): cast(str, c) for v, c in rows}


def _numbered(applied: dict[int, str]) -> dict[int, str]:
    return {v: c for v, c in applied.items() if v != FUNCTIONS_VERSION}


def _check_history(applied: dict[int, str], known: list[Migration]) -> None:
    by_version = {m.version: m for m in known}
    for version, checksum in sorted(_numbered(applied).items()):
        m = by_version.get(version)
        if m is None:
            raise MigrationError(
                f"the database has migration {version}, which this runlease does not know: "
                "it was migrated by a newer version"
            )
        if checksum not in (m.checksum, _RELEASED.get(version)):
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
            todo = [m for m in known if m.version not in applied]
            funcs = functions()
            if not todo and applied.get(FUNCTIONS_VERSION) == funcs.checksum:
                return []
            with conn.transaction():
                for m in todo:
                    report(f"applying {m.file}")
                    conn.execute(m.sql)
                    _record(conn, m)
                # Always after migrations: one may have dropped what a
                # function or trigger used.
                report(f"applying {funcs.file}")
                conn.execute(funcs.sql)
                _record(conn, funcs)
            return todo
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))


def _record(conn: psycopg.Connection[tuple[object, ...]], m: Migration) -> None:
    conn.execute(
        "INSERT INTO runlease_migrations (version, name, checksum) VALUES (%s, %s, %s)"
        " ON CONFLICT (version) DO UPDATE"
        " SET name = excluded.name, checksum = excluded.checksum, applied_at = now()",
        (m.version, m.name, m.checksum),
    )


def pending(url: str) -> list[Migration]:
    """What migrate would apply: the migrations not applied yet, then
    functions() if any is or its checksum differs from the recorded one
    (everything on an empty database)."""
    known = migrations()
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('runlease_migrations') IS NOT NULL").fetchone()
        applied = _applied(conn) if exists and exists[0] else {}
    _check_history(applied, known)
    todo = [m for m in known if m.version not in applied]
    funcs = functions()
    if todo or applied.get(FUNCTIONS_VERSION) != funcs.checksum:
        todo.append(funcs)
    return todo
