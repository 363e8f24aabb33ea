"""A database as an older runlease left it, for upgrade tests.

An upgrade test builds the database the way that runlease did: the
migrations up to its last, its own functions.sql, and rows written by its
own named statements, verbatim (copied into tests/fixtures/schema_<NNNN>/
from the last commit of that schema). Then the real `migrate` takes it to
the head and the current code takes over.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from runlease.clock import ManualClock
from runlease.db import queries
from runlease.db.channels import POOL_CHANNEL_PREFIX
from runlease.db.connect import make_conn_pool
from runlease.db.migrate import FUNCTIONS_VERSION, migrations
from runlease.db.store import RunStore

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@cache
def old_statements(folder: Path) -> dict[str, str]:
    """The named statements of the SQL files in `folder`, parts filled in
    as db/queries.py does (functions.sql is applied whole, not named)."""
    names: dict[str, str] = {}
    parts: dict[str, str] = {}
    for path in sorted(folder.glob("*.sql")):
        if path.name == "functions.sql":
            continue
        # The loader's own splitter: the same rules as the old one.
        sections = queries._sections(path.read_text(encoding="utf-8"), path.name)
        names |= sections["name"]
        parts |= sections["part"]
    return {n: queries.fill(text, parts, n) for n, text in names.items()}


def migrate_to(url: str, folder: Path, last: int, last_name: str) -> None:
    """Migrations 0001..`last` and the functions.sql in `folder`, applied
    and recorded as the runlease of that schema did. `last_name` guards the
    numbering: migration `last` must still be the one that runlease knew."""
    known = migrations()
    assert (known[last - 1].version, known[last - 1].name) == (last, last_name)
    functions_sql = (folder / "functions.sql").read_text(encoding="utf-8")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE runlease_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        with conn.transaction():
            recorded = [(m.version, m.name, m.sql) for m in known[:last]]
            for _, _, sql in recorded:
                conn.execute(sql)
            conn.execute(functions_sql)
            for version, name, sql in [*recorded, (FUNCTIONS_VERSION, "functions", functions_sql)]:
                conn.execute(
                    "INSERT INTO runlease_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (version, name, hashlib.sha256(sql.encode()).hexdigest()),
                )


class OldStatements:
    """An older runlease's connection, running its own statements by name."""

    folder: Path

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)

    def run(self, statement: str, now: datetime | None, /,
            **params: Any) -> list[dict[str, Any]]:
        cur = self.conn.execute(old_statements(self.folder)[statement], params | {"now": now})
        return cur.fetchall() if cur.description is not None else []

    def enqueue(self, now: datetime, n: int, *, tenant: str = "acme", **extra: Any) -> list[UUID]:
        """n runs of pool default, through run_enqueue (the same parameters
        from schema 0014 to 0018): their ids."""
        runs = [{"ord": i, "id": str(uuid4()), "pool": "default", "tenant_id": tenant,
                 "priority": 0, "input_json": {"i": i}, "budget_json": {}, **extra}
                for i in range(n)]
        rows = self.run("run_enqueue", now, runs=Jsonb(runs),
                        channel_prefix=POOL_CHANNEL_PREFIX, notify=False)
        assert len(rows) == n
        return [UUID(r["id"]) for r in runs]


@asynccontextmanager
async def store_at(url: str, now: datetime) -> AsyncIterator[tuple[RunStore, ManualClock]]:
    """The current code's store on the upgraded database, its clock at the
    instant of the old writes (the migration ran just after them)."""
    clock = ManualClock(now)
    async with make_conn_pool(url, max_size=4) as conn_pool:
        yield RunStore(conn_pool, clock=clock), clock


def snapshot(url: str) -> dict[UUID, tuple[Any, ...]]:
    """Each run: status, attempts, epoch, cancel requested, error code, delayed."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT id, status, attempts, lease_epoch, cancel_requested_at IS NOT NULL,"
            " error_code, delayed FROM agent_runs"
        ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def counts_consistent(url: str) -> None:
    """agent_run_counts plus its deltas equal what count(*) finds."""
    with psycopg.connect(url) as conn:
        kept = conn.execute(
            "SELECT pool, tenant_id, state, error_code, sum(n)::int FROM"
            " (SELECT pool, tenant_id, state, error_code, n FROM agent_run_counts"
            "  UNION ALL SELECT pool, tenant_id, state, error_code, n"
            "  FROM agent_run_count_deltas) c"
            " GROUP BY 1, 2, 3, 4 HAVING sum(n) <> 0 ORDER BY 1, 2, 3, 4"
        ).fetchall()
        counted = conn.execute(
            "SELECT pool, tenant_id, state, error_code, count(*)::int FROM"
            " (SELECT pool, tenant_id, runlease_counted_state(status, delayed) AS state,"
            "         CASE WHEN status = 'dead' THEN coalesce(error_code, '') ELSE '' END"
            "           AS error_code FROM agent_runs"
            "  UNION ALL SELECT pool, tenant_id, 'total', '' FROM agent_runs) c"
            " WHERE state <> '' GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
        ).fetchall()
    assert kept == counted
