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


async def test_a_keeper_whose_database_is_gone_retries_at_its_pace(
        caplog: pytest.LogCaptureFixture) -> None:
    """With no incarnation and the database unreachable, the lease keeper
    tries to register again once per interval (at most a second), not at
    every wake-up: it used to spin a core (seen as orphaned dev workers at
    30 % CPU each)."""
    import asyncio
    import logging

    from runlease.db.connect import make_conn_pool
    from runlease.db.store import RunStore
    from runlease.worker.holder import LeaseHolder
    from runlease.worker.lease_keeper import LeaseKeeper

    url = f"postgresql://runlease@127.0.0.1:{free_port()}/runlease?connect_timeout=2"
    conn_pool = make_conn_pool(url, max_size=1)
    holder = LeaseHolder(RunStore(conn_pool), url, "test-keeper", pool="default", lease_s=15)
    keeper = LeaseKeeper(holder, [], interval_s=5, on_lost=lambda *_: None, concurrency=1)
    with caplog.at_level(logging.WARNING, logger="runlease.worker.lease_keeper"):
        keeper.start()
        await asyncio.sleep(2.5)
        await keeper.stop()
    tries = [r for r in caplog.records if "worker_register_failed" in r.getMessage()]
    # One at start, then one a second: about 3 in 2.5 s (hundreds when it spun).
    assert 1 <= len(tries) <= 5, len(tries)
