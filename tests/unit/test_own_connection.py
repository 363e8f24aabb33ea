"""A loop's own connection that cannot reach the server fails as every
statement does when the database is down (DatabaseUnavailable, retryable), so
a worker started while its database restarts waits for it instead of exiting
(the chaos test's database restart caught a worker that exited)."""

from __future__ import annotations

from functools import partial

import pytest

from runlease.db.connect import connect
from runlease.db.embedded import free_port
from runlease.errors import DatabaseUnavailable
from runlease.worker.holder import OwnConnection


async def test_an_unreachable_server_is_a_retryable_error() -> None:
    url = f"postgresql://runlease@127.0.0.1:{free_port()}/runlease?connect_timeout=2"
    own = OwnConnection(partial(connect, url, application_name="test"))
    with pytest.raises(DatabaseUnavailable, match="connection"):
        await own.get()
    assert own.conn is None
