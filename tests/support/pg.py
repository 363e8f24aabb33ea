"""A PostgreSQL server of the test's own, for tests that stop and start it.

The session's shared server (tests/conftest.py) must stay up for every other
test; a test that restarts the database gets a server of its own, migrated.
"""

from __future__ import annotations

import random
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runlease.db.embedded import EmbeddedPostgres
from runlease.db.migrate import migrate


def port_outside_the_ephemeral_range() -> int:
    """A free port no client socket can be given: while a restarted server is
    down, the kernel hands out ephemeral ports (the local ends of every new
    connection) and one of them could be the server's, which then cannot
    listen there again. Ports below the ephemeral range are never handed out."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randint(max(1025, low - 12000), low - 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


@contextmanager
def own_postgres(*, durable: bool = True) -> Iterator[EmbeddedPostgres]:
    """A started, migrated server; its URL is `.url`. `durable=True` keeps
    commits across an immediate (crash-like) shutdown: with
    synchronous_commit off, such a stop loses the last committed transactions."""
    # Not pytest's tmp_path: that is mode 0700, and PostgreSQL runs as another
    # user when we are root.
    data = Path(tempfile.mkdtemp(prefix="runlease-own-pg-"))
    data.chmod(0o755)
    server = EmbeddedPostgres(data, durable=durable, port=port_outside_the_ephemeral_range())
    server.start()
    try:
        migrate(server.url)
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(data, ignore_errors=True)
