"""The `pgbouncer` and `bouncer_url` fixtures (a pytest plugin, registered
in tests/conftest.py), over tests/support/pgbouncer.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.pgbouncer import PgBouncer


@pytest.fixture(scope="session")
def pgbouncer(server_url: str) -> Iterator[PgBouncer]:
    """The session's PgBouncer, transaction pooling, in front of its server."""
    try:
        bouncer = PgBouncer(server_url)
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture
def bouncer_url(pgbouncer: PgBouncer, db_url: str) -> str:
    """The test's fresh database (db_url, still the direct URL) through PgBouncer."""
    return pgbouncer.url(db_url)
