"""The worker's fence and claim loop driven by an injected clock, without sleeping.

One ManualClock moves both the database's instant (the lease) and the
worker's monotonic clock (the fence), so the two are compared exactly.
"""

from __future__ import annotations

import asyncio

from runlease.clock import ManualClock
from runlease.core.states import RunStatus
from runlease.db.models import Lease
from runlease.db.store import RunStore
from runlease.worker.claimer import ClaimLoop
from runlease.worker.handle import AttemptTerms, RunHandle, StopReason
from runlease.worker.holder import LeaseHolder
from runlease.worker.lease_keeper import LeaseKeeper


def handle_for(lease: Lease, clock: ManualClock) -> RunHandle:
    terms = AttemptTerms(lease_s=30, margin_s=5, cancel_grace_s=1, kill_grace_s=1, clock=clock)
    return RunHandle(lease, terms, claimed_at=clock.monotonic())


async def test_the_fence_moves_with_each_renewal_and_stops_the_run_in_time(
    store: RunStore, clock: ManualClock, db_url: str
) -> None:
    await store.enqueue("default", "acme", {})
    holder = LeaseHolder(store, db_url, "w1", pool="default", lease_s=30, clock=clock,
                         fence_after_s=25)
    handles: list[RunHandle] = []
    lost: list[StopReason] = []
    keeper = LeaseKeeper(holder, handles, interval_s=10,
                         on_lost=lambda _, why: lost.append(why))
    try:
        assert await keeper.beat()  # registers the incarnation at 0 s: fence at 25 s
        inc = holder.current
        assert inc is not None
        assert inc.fence_at == 25
        (lease,) = await store.claim("default", inc.id, 1)
        handle = handle_for(lease, clock)
        handle.incarnation = inc
        handles.append(handle)
        clock.advance(20)
        assert handle.may_write()
        assert await keeper.beat()  # sent at 20 s: the fence moves to 20 + 30 - 5
        assert handle.fence_at == 45

        clock.advance(24.9)  # past the first fence (25 s), short of the renewed one
        keeper.fence(clock.monotonic())
        assert handle.may_write()
        assert handle.reason is None

        clock.advance(0.2)
        keeper.fence(clock.monotonic())
        assert handle.reason is StopReason.SELF_FENCED
        assert not handle.may_write()
        assert handle.lost.done()
        # Stopped while the database still holds the lease (until 50 s): no
        # other worker could have claimed the run yet.
        assert await store.claim("default", "w2", 1, lease_s=30) == []
        assert lost == []  # fenced by its own clock, not told by a renewal
        # The incarnation is over for good: the next beat registers another.
        assert inc.over
        assert holder.current is None
        assert await keeper.beat()
        assert holder.current is not None
        assert holder.current.id != inc.id
        assert holder.current.id.startswith("w1:")
    finally:
        await keeper.stop()
        await keeper._db.close()
        for handle in handles:
            if handle._killing is not None:
                await handle._killing


async def test_a_write_checks_the_fence_by_the_injected_clock(
    store: RunStore, clock: ManualClock
) -> None:
    await store.enqueue("default", "acme", {})
    (lease,) = await store.claim("default", "w1", 1, lease_s=30)
    handle = handle_for(lease, clock)
    clock.advance(24.99)
    assert handle.may_write()
    clock.advance(0.01)
    assert not handle.may_write()  # at the fence, whoever notices first
    assert handle.reason is StopReason.SELF_FENCED
    if handle._killing is not None:
        await handle._killing


async def test_the_claim_loop_fills_free_slots_once_per_run_once(
    store: RunStore, clock: ManualClock, db_url: str
) -> None:
    for i in range(4):
        await store.enqueue("default", "acme", {"i": i})
    started: list[tuple[Lease, float]] = []
    free = [2]
    holder = LeaseHolder(store, db_url, "w1", pool="default", lease_s=30, clock=clock)
    keeper = LeaseKeeper(holder, [], interval_s=10, on_lost=lambda *_: None)
    loop = ClaimLoop(holder, batch=10, poll_interval_s=2.0, free_slots=lambda: free[0],
                     start_run=lambda lease, sent, _inc: started.append((lease, sent)),
                     wake=asyncio.Event(), slot_freed=asyncio.Event())
    try:
        clock.advance(100)
        assert await keeper.beat()  # the incarnation the loop claims as
        assert await loop.run_once() == 0.0  # every free slot filled: claim again at once
        assert [sent for _, sent in started] == [100, 100]  # the fence starts at the send

        free[0] = 5
        wait_s = await loop.run_once()  # two left for five slots: poll later
        assert len(started) == 4
        assert 1.5 <= wait_s <= 2.5

        await store.enqueue("default", "acme", {"i": 4})
        loop.halt()  # the drain began while a claim was under way
        assert await loop.run_once() == 0.0
        assert len(started) == 4  # handed back at once, not started
        (run,) = [r for r in await store.list_runs(pool="default")
                  if r.input_json == {"i": 4}]
        assert run.status == RunStatus.PENDING
        assert run.attempts == 0
    finally:
        await loop.stop()
        await loop.close()
        await keeper._db.close()
