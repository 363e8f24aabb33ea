"""Event streams: replay from the table, then follow through the fan-out.

A subscriber first replays from the table everything after its
Last-Event-ID; seq values become visible in order (they are handed out under
the run's row lock), so "after N" never skips one. Then it follows the run's
feed, which the process's one fan-out reader (api/fanout.py) fills for every
subscriber of the run at once: a thousand idle streams cost no query, and a
hundred browsers on one busy run cost one read per change. The stream ends
with an `end` event once the run is finished and every event has been sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from uuid import UUID

from runlease.api.fanout import Fanout, RunFeed, render
from runlease.db.models import Event, Run
from runlease.db.store import RunStore
from runlease.errors import RunNotFound

__all__ = ["Batch", "End", "FeedHub", "Keepalive", "RunFeed", "StreamSlot", "render"]

PAGE = 500


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


def batch(events: list[Event], rendered: dict[int, str] | None = None) -> Batch:
    texts = [(rendered or {}).get(e.seq) or render(e) for e in events]
    return Batch("".join(texts))


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
    def __init__(self, store: RunStore, fanout: Fanout, *, keepalive_s: float = 15.0,
                 max_per_tenant: int | None = None) -> None:
        self.store = store
        self.fanout = fanout
        self.keepalive_s = keepalive_s
        self.max_per_tenant = max_per_tenant
        self.open_by_tenant: dict[str, int] = {}
        self.closed = False

    @property
    def feeds(self) -> dict[UUID, RunFeed]:
        return self.fanout.feeds

    async def close(self) -> None:
        """End every stream (on shutdown): open streams must not hold it up."""
        self.closed = True
        for feed in list(self.feeds.values()):
            await feed.wake()

    def admit(self, tenant: str) -> StreamSlot | None:
        """A slot for one more stream of `tenant`, or None at its cap."""
        held = self.open_by_tenant.get(tenant, 0)
        if self.max_per_tenant is not None and held >= self.max_per_tenant:
            return None
        self.open_by_tenant[tenant] = held + 1
        return StreamSlot(self, tenant)

    async def stream(self, run_id: UUID, after: int) -> AsyncIterator[Batch | End | Keepalive]:
        """Everything after `after`, then live events, then End."""
        while True:  # replay from the table first
            page = await self.store.events_after(run_id, after, limit=PAGE)
            if page:
                yield batch(page)
                after = page[-1].seq
            if len(page) < PAGE:
                break
        feed = self.fanout.follow(run_id, after)
        try:
            async for item in self._follow(feed, after):
                yield item
        finally:
            self.fanout.unfollow(feed)

    async def _follow(self, feed: RunFeed, after: int) -> AsyncIterator[Batch | End | Keepalive]:
        while not self.closed:
            fresh = feed.covering(after)
            if fresh is None:  # fell behind the ring: from the table, for this one
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
            if feed.gone:
                raise RunNotFound(feed.run_id)
            idle = False
            async with feed.changed:
                # Checked under the lock the reader notifies under: no lost wake-up.
                if (feed.last_seq <= after and feed.finished is None and not feed.gone
                        and not self.closed):
                    try:
                        await asyncio.wait_for(feed.changed.wait(), self.keepalive_s)
                    except TimeoutError:
                        idle = True
            if idle:  # never yield while holding the feed's lock
                yield Keepalive()
