"""The lease holder: what the claim loop and the lease keeper share.

Both act for this worker, in its pool, by the same lease length and the same
monotonic clock, and each on a connection of its own (a claim or a renewal
must never wait for a connection the runs' writes hold). They also share the
worker's current incarnation (worker/incarnation.py): the keeper registers
and renews it, the claim loop claims as it. The worker builds one
LeaseHolder and hands it to both, so they cannot claim by one set of terms
and renew by another.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from functools import partial

import psycopg

from runlease.clock import Clock, SystemClock
from runlease.db.connect import Conn, connect
from runlease.db.store import RunStore
from runlease.errors import DatabaseUnavailable
from runlease.worker.incarnation import Incarnation

log = logging.getLogger(__name__)


@dataclass
class LeaseHolder:
    """This worker as the holder of its pool's leases. `identity` is the
    worker's (pod UID or host, boot id, pid); each incarnation's id adds a
    random part to it."""

    store: RunStore
    url: str
    identity: str
    _: KW_ONLY
    pool: str
    lease_s: int
    prepare: bool = True
    # The worker's monotonic clock: the fence and the heartbeat schedule are
    # read from it (sleeps are the event loop's own, whatever it says).
    clock: Clock = field(default_factory=SystemClock)
    # How long after a renewal was sent its leases are still surely held,
    # by this clock (lease_s less the worker's safety margin).
    fence_after_s: float = 0.0
    # The incarnation claims are made as: None until one is registered, and
    # from when one is over until the next is.
    current: Incarnation | None = None
    # Set while `current` is a live incarnation: the claim loop waits on it.
    registered: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if self.fence_after_s <= 0:
            self.fence_after_s = float(self.lease_s)

    @property
    def worker(self) -> str | None:
        """The current incarnation's id, or None when there is none."""
        return self.current.id if self.current is not None else None

    def own_connection(self, application_name: str) -> OwnConnection:
        return OwnConnection(partial(connect, self.url, prepare=self.prepare,
                                     application_name=application_name))


class OwnConnection:
    """One loop's dedicated connection: opened when first needed, and again
    after it was dropped."""

    def __init__(self, open_: Callable[[], Awaitable[Conn]]) -> None:
        self._open = open_
        self.conn: Conn | None = None
        self._closing: set[asyncio.Task[None]] = set()

    async def get(self) -> Conn:
        if self.conn is None or self.conn.closed:
            try:
                self.conn = await self._open()
            except psycopg.OperationalError as exc:
                # As every statement's own failure to reach the server: a
                # retryable error each loop already handles (a worker started
                # while the database restarts waits for it, never exits).
                raise DatabaseUnavailable(str(exc).strip()) from exc
        return self.conn

    def abandon(self) -> None:
        """Drop the connection without waiting on it (its socket may be dead);
        the next get() opens another."""
        conn, self.conn = self.conn, None
        if conn is not None:
            task = asyncio.ensure_future(_close_quietly(conn, 5.0))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self, timeout_s: float | None = None) -> None:
        """Drop the connection and wait for it to close (for timeout_s at most)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            await _close_quietly(conn, timeout_s)


async def _close_quietly(conn: Conn, timeout_s: float | None) -> None:
    try:
        await asyncio.wait_for(conn.close(), timeout_s)
    except Exception:  # a broken socket may raise anything
        log.debug("own_connection_close_failed", exc_info=True)
