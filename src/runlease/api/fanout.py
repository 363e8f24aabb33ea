"""The API's event fan-out: one reader for every run followed by a stream.

A NOTIFY on the events channel (one LISTEN session per process, see
services/listener.py) marks its run due. One task collects the runs woken
within a short window and reads the new events of all of them in one
statement, on one connection of its own; each run's events are rendered once
into its feed, and every subscriber of the run is woken. The same read
carries each run's status, so a finished run is seen without a query per
stream. An idle stream costs no query at all.

NOTIFY is not durable: while the LISTEN session is down, every followed run
is read in one batched statement each `poll_s`; when it is back, one more
read of all of them covers the gap. Reads go by seq, so nothing is lost or
repeated whichever way a run is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from uuid import UUID

import psycopg

from runlease import metrics
from runlease.db.connect import Conn, connect
from runlease.db.events import MAX_FANOUT_RUNS
from runlease.db.models import Event, Run
from runlease.db.store import RunStore
from runlease.errors import RunleaseError

log = logging.getLogger(__name__)

RING = 2048  # events a feed keeps for subscribers that join or fall behind
WINDOW_S = 0.005  # wake-ups within this are read together
READ_APP_NAME = "runlease-api-feed"


def render(event: Event) -> str:
    data = json.dumps({"seq": event.seq, "kind": event.kind, "data": event.data,
                       "created_at": event.created_at.isoformat()})
    return f"id: {event.seq}\nevent: {event.kind}\ndata: {data}\n\n"


class RunFeed:
    """One followed run: its recent events, rendered once, and whether it
    ended. Only the fan-out's reader writes it; subscribers wait on
    `changed`."""

    def __init__(self, run_id: UUID, start_seq: int) -> None:
        self.run_id = run_id
        self.events: list[Event] = []
        self.rendered: dict[int, str] = {}  # seq -> its SSE text
        self.last_seq = start_seq  # everything up to here is known or was before our time
        self.first_seq = start_seq + 1  # the ring holds events from here on
        self.finished: Run | None = None
        self.gone = False  # deleted (retention) while followed
        self.changed = asyncio.Condition()
        self.subscribers = 0

    def covering(self, after: int) -> list[Event] | None:
        """Events after `after` from the ring, or None if it does not reach back."""
        if after + 1 < self.first_seq:
            return None
        return [e for e in self.events if e.seq > after]

    def keep(self, fresh: list[Event]) -> None:
        fresh = [e for e in fresh if e.seq > self.last_seq]
        if not fresh:
            return
        self.events.extend(fresh)
        for event in fresh:
            self.rendered[event.seq] = render(event)
        self.last_seq = fresh[-1].seq
        if len(self.events) > RING:
            drop = len(self.events) - RING
            self.first_seq = self.events[drop].seq
            for gone in self.events[:drop]:
                self.rendered.pop(gone.seq, None)
            del self.events[:drop]

    async def wake(self) -> None:
        async with self.changed:
            self.changed.notify_all()


class Fanout:
    """The followed runs of one API process, and the one task that reads them."""

    def __init__(self, store: RunStore, url: str, *, prepare: bool = True,
                 poll_s: float = 1.0, window_s: float = WINDOW_S) -> None:
        self.store = store
        self.url = url
        self.prepare = prepare
        self.poll_s = poll_s
        self.window_s = window_s
        self.feeds: dict[UUID, RunFeed] = {}
        self.listening = False  # the LISTEN session is up: no polling
        self.reads = 0  # batched statements run (a gauge for tests and bench)
        self._due: set[UUID] = set()
        self._kick = asyncio.Event()
        self._last_poll = 0.0
        self._conn: Conn | None = None
        self._task: asyncio.Task[None] | None = None
        self._reading = False

    # -- what the hub and the listener call ------------------------------------------------

    def follow(self, run_id: UUID, after: int) -> RunFeed:
        """The run's feed, with one more subscriber that has seen `after`."""
        feed = self.feeds.get(run_id)
        if feed is None:
            feed = self.feeds[run_id] = RunFeed(run_id, after)
            self._mark(run_id)  # its first read: events since the replay, and its status
        elif after > feed.last_seq:
            self._mark(run_id)  # the subscriber's replay saw newer events than the feed
        feed.subscribers += 1
        return feed

    def unfollow(self, feed: RunFeed) -> None:
        feed.subscribers -= 1
        if feed.subscribers == 0 and self.feeds.get(feed.run_id) is feed:
            del self.feeds[feed.run_id]
            self._due.discard(feed.run_id)

    def notify(self, payload: str) -> None:
        """A NOTIFY on the events channel: `<run id>:<seq>`."""
        run_id, _, seq = payload.partition(":")
        try:
            feed = self.feeds.get(UUID(run_id))
        except ValueError:
            return
        # Equal is not known: a run's end notifies the seq of its last event.
        if feed is not None and not (seq.isdigit() and int(seq) < feed.last_seq):
            self._mark(feed.run_id)

    def connected(self) -> None:
        """The LISTEN session is (back) up: one read of every run covers the gap."""
        self.listening = True
        self._mark(*self.feeds)

    def disconnected(self) -> None:
        """The LISTEN session is lost: poll every followed run until it is back."""
        self.listening = False
        self._last_poll = 0.0
        self._kick.set()

    @property
    def settled(self) -> bool:
        """Nothing due and no read under way (tests wait for this)."""
        return not self._due and not self._reading

    def connections(self) -> int:
        """Database connections the reader holds (the LISTEN session aside)."""
        return int(self._conn is not None and not self._conn.closed)

    # -- the reader ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._main(), name="feed-fanout")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    def _mark(self, *run_ids: UUID) -> None:
        self._due.update(run_ids)
        self._kick.set()

    async def _main(self) -> None:
        while True:
            await self._wait()
            if self.window_s:
                await asyncio.sleep(self.window_s)  # gather the wake-ups of the window
            self._kick.clear()
            due, self._due = self._due, set()
            if not self.listening and time.monotonic() >= self._last_poll + self.poll_s:
                self._last_poll = time.monotonic()
                due.update(self.feeds)
            feeds = [f for f in map(self.feeds.get, due) if f is not None]
            if not feeds:
                continue
            self._reading = True
            try:
                await self._read(feeds)
            except Exception as exc:  # every stream of the process hangs on this task
                if isinstance(exc, RunleaseError | psycopg.Error):
                    log.warning("feed_read_failed runs=%d error=%s", len(feeds),
                                str(exc).strip() or type(exc).__name__)
                else:
                    log.exception("feed_read_failed runs=%d", len(feeds))
                await self._drop_conn()
                self._due.update(f.run_id for f in feeds if f.run_id in self.feeds)
                await asyncio.sleep(self.poll_s)
            finally:
                self._reading = False

    async def _wait(self) -> None:
        if self._due:
            return
        timeout = None
        if not self.listening:
            timeout = max(0.0, self._last_poll + self.poll_s - time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._kick.wait(), timeout)

    async def _read(self, feeds: list[RunFeed]) -> None:
        for start in range(0, len(feeds), MAX_FANOUT_RUNS):
            await self._read_some(feeds[start:start + MAX_FANOUT_RUNS])

    async def _read_some(self, feeds: list[RunFeed]) -> None:
        conn = await self._connection()
        self._count()
        news, limit = await self.store.events_fanout({f.run_id: f.last_seq for f in feeds},
                                                     conn=conn)
        woken: list[RunFeed] = []
        ended: list[RunFeed] = []
        for feed in feeds:
            found = news.get(feed.run_id)
            if found is None:
                feed.gone = True
                woken.append(feed)
                continue
            before = feed.last_seq
            feed.keep(found.events)
            if len(found.events) >= limit:
                self._mark(feed.run_id)  # more are waiting: read again at once
            elif found.finished:
                # Nothing is written after the final transition, and the
                # status came from the same snapshot as the events: complete.
                ended.append(feed)
            if feed.last_seq != before:
                woken.append(feed)
        if ended:
            self._count()
            final = await self.store.runs_ended([f.run_id for f in ended], conn=conn)
            for feed in ended:
                feed.finished = final.get(feed.run_id)
                feed.gone = feed.finished is None
                woken.append(feed)
        await _wake(woken)

    def _count(self) -> None:
        self.reads += 1
        metrics.SSE_FEED_READS.inc()

    async def _connection(self) -> Conn:
        if self._conn is None or self._conn.closed or self._conn.broken:
            await self._drop_conn()
            self._conn = await connect(self.url, prepare=self.prepare,
                                       application_name=READ_APP_NAME)
        return self._conn

    async def _drop_conn(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None


async def _wake(feeds: Iterable[RunFeed]) -> None:
    for feed in feeds:
        await feed.wake()
