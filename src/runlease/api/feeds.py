"""Event streams: replay from the table, then follow, shared per run.

Each API process keeps one LISTEN session on the events channel and, per run
being watched, one feed task: on a NOTIFY (or a poll, since NOTIFY is not
durable) it reads the new events once and wakes every subscriber, so a
hundred browsers on one busy run cost one query per change, not a hundred.

A subscriber first replays from the table everything after its
Last-Event-ID; seq values become visible in order (they are handed out under
the run's row lock), so "after N" never skips one. The stream ends with an
`end` event once the run is finished and every event has been sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from uuid import UUID

from runlease.core.states import TERMINAL
from runlease.db.models import Event, Run
from runlease.db.store import RunStore
from runlease.errors import RunleaseError, RunNotFound

log = logging.getLogger(__name__)

PAGE = 500
RING = 2048


@dataclass(frozen=True, slots=True)
class End:
    run: Run


@dataclass(frozen=True, slots=True)
class Keepalive:
    pass


@dataclass(frozen=True, slots=True)
class Batch:
    """The SSE text of events in order, rendered once for every subscriber."""

    text: str


def render(event: Event) -> str:
    data = json.dumps({"seq": event.seq, "kind": event.kind, "data": event.data,
                       "created_at": event.created_at.isoformat()})
    return f"id: {event.seq}\nevent: {event.kind}\ndata: {data}\n\n"


def batch(events: list[Event], rendered: dict[int, str] | None = None) -> Batch:
    texts = [(rendered or {}).get(e.seq) or render(e) for e in events]
    return Batch("".join(texts))


class RunFeed:
    def __init__(self, hub: FeedHub, run_id: UUID, start_seq: int) -> None:
        self.hub = hub
        self.run_id = run_id
        self.events: list[Event] = []
        self.rendered: dict[int, str] = {}  # seq -> its SSE text
        self.last_seq = start_seq  # everything up to here is known or was before our time
        self.first_seq = start_seq + 1  # the ring holds events from here on
        self.finished: Run | None = None
        self.changed = asyncio.Condition()
        self.wake = asyncio.Event()
        self.subscribers = 0
        self.task: asyncio.Task[None] | None = None

    def covering(self, after: int) -> list[Event] | None:
        """Events after `after` from the ring, or None if it does not reach back."""
        if after + 1 < self.first_seq:
            return None
        return [e for e in self.events if e.seq > after]

    async def run(self) -> None:
        while self.subscribers > 0 and self.finished is None:
            # Cleared before the read: a NOTIFY that lands during it is not lost.
            self.wake.clear()
            try:
                fresh = await self._read()
            except RunNotFound:  # deleted by retention while followed
                return
            except RunleaseError as exc:
                log.warning("feed_read_failed run_id=%s error=%s", self.run_id, exc)
                fresh = []
            if fresh:
                self._keep(fresh)
            if fresh or self.finished:
                async with self.changed:
                    self.changed.notify_all()
            if fresh and len(fresh) == PAGE:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.hub.poll_s)

    async def _read(self) -> list[Event]:
        store = self.hub.store
        fresh = await store.events_after(self.run_id, self.last_seq, limit=PAGE)
        if not fresh:
            run = await store.get(self.run_id)
            if run.status in TERMINAL:
                # Nothing is written after the final transition, so one more
                # read after seeing it finished is complete.
                fresh = await store.events_after(self.run_id, self.last_seq, limit=PAGE)
                if not fresh:
                    self.finished = run
        return fresh

    def _keep(self, fresh: list[Event]) -> None:
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


class StreamSlot:
    """One open stream of a tenant, counted against its cap; release() is
    idempotent (the stream's end and the response's end both call it)."""

    def __init__(self, hub: FeedHub, tenant: str) -> None:
        self.hub, self.tenant, self.held = hub, tenant, True

    def release(self) -> None:
        if self.held:
            self.held = False
            left = self.hub.open_by_tenant[self.tenant] - 1
            if left:
                self.hub.open_by_tenant[self.tenant] = left
            else:
                del self.hub.open_by_tenant[self.tenant]


class FeedHub:
    def __init__(self, store: RunStore, *, poll_s: float = 1.0, keepalive_s: float = 15.0,
                 max_per_tenant: int | None = None) -> None:
        self.store = store
        self.poll_s = poll_s
        self.keepalive_s = keepalive_s
        self.max_per_tenant = max_per_tenant
        self.open_by_tenant: dict[str, int] = {}
        self.feeds: dict[UUID, RunFeed] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    async def close(self) -> None:
        """End every stream (on shutdown): open streams must not hold it up."""
        self.closed = True
        for feed in list(self.feeds.values()):
            async with feed.changed:
                feed.changed.notify_all()

    def admit(self, tenant: str) -> StreamSlot | None:
        """A slot for one more stream of `tenant`, or None at its cap."""
        held = self.open_by_tenant.get(tenant, 0)
        if self.max_per_tenant is not None and held >= self.max_per_tenant:
            return None
        self.open_by_tenant[tenant] = held + 1
        return StreamSlot(self, tenant)

    def notify(self, payload: str) -> None:
        """A NOTIFY on the events channel: `<run id>:<seq>`."""
        run_id, _, _ = payload.partition(":")
        try:
            feed = self.feeds.get(UUID(run_id))
        except ValueError:
            return
        if feed is not None:
            feed.wake.set()

    def wake_all(self) -> None:
        for feed in self.feeds.values():
            feed.wake.set()

    async def stream(self, run_id: UUID, after: int) -> AsyncIterator[Batch | End | Keepalive]:
        """Everything after `after`, then live events, then End."""
        while True:  # replay from the table first
            page = await self.store.events_after(run_id, after, limit=PAGE)
            if page:
                yield batch(page)
                after = page[-1].seq
            if len(page) < PAGE:
                break
        feed = self.feeds.get(run_id)
        if feed is None:
            feed = self.feeds[run_id] = RunFeed(self, run_id, after)
        feed.subscribers += 1
        if feed.task is None or feed.task.done():
            feed.task = asyncio.create_task(feed.run(), name=f"feed-{run_id}")
            # Held here too: a feed left by its last subscriber is out of
            # `feeds` while it finishes its read.
            self._tasks.add(feed.task)
            feed.task.add_done_callback(self._tasks.discard)
        try:
            async for item in self._follow(feed, after):
                yield item
        finally:
            feed.subscribers -= 1
            if feed.subscribers == 0:
                # Woken, not cancelled: it ends after its current read. A
                # cancel while it waits for a pooled connection could leave
                # the pool's next waiter unserved until its timeout.
                feed.wake.set()
                self.feeds.pop(run_id, None)

    async def _follow(self, feed: RunFeed, after: int) -> AsyncIterator[Batch | End | Keepalive]:
        while not self.closed:
            fresh = feed.covering(after)
            if fresh is None:
                fresh = await self.store.events_after(feed.run_id, after, limit=PAGE)
            if fresh:
                # One chunk per wake-up, rendered once per feed: a hundred
                # subscribers of a busy run cost little more than one.
                yield batch(fresh, feed.rendered)
                after = fresh[-1].seq
            if fresh and len(fresh) == PAGE:
                continue
            if feed.finished is not None and feed.last_seq <= after:
                yield End(feed.finished)
                return
            if feed.task is not None and feed.task.done() and feed.finished is None:
                raise RunNotFound(feed.run_id)
            idle = False
            async with feed.changed:
                # Checked under the lock the feed notifies under: no lost wake-up.
                if feed.last_seq <= after and feed.finished is None and not self.closed:
                    try:
                        await asyncio.wait_for(feed.changed.wait(), self.keepalive_s)
                    except TimeoutError:
                        idle = True
            if idle:  # never yield while holding the feed's lock
                yield Keepalive()
