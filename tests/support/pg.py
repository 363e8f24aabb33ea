"""A PostgreSQL server of the test's own, for tests that stop and start it.

The session's shared server (tests/conftest.py) must stay up for every other
test; a test that restarts the database gets a server of its own, migrated.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runlease.db.embedded import EmbeddedPostgres
from runlease.db.migrate import migrate


@contextmanager
def own_postgres(*, durable: bool = True) -> Iterator[EmbeddedPostgres]:
    """A started, migrated server; its URL is `.url`. `durable=True` keeps
    commits across an immediate (crash-like) shutdown: with
    synchronous_commit off, such a stop loses the last committed transactions."""
    # Not pytest's tmp_path: that is mode 0700, and PostgreSQL runs as another
    # user when we are root.
    data = Path(tempfile.mkdtemp(prefix="runlease-own-pg-"))
    data.chmod(0o755)
    server = EmbeddedPostgres(data, durable=durable)
    server.start()
    try:
        migrate(server.url)
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(data, ignore_errors=True)
