"""Threads (issue 27, ARCHITECTURE invariant 11): at most one run of a
tenant's thread is leased at any instant, and a thread's runs start in
submit order; a submit to a busy thread follows its multitask policy."""

from __future__ import annotations

import asyncio
import threading
import time
from uuid import UUID

import psycopg
import pytest

from runlease.db.connect import make_conn_pool
from runlease.db.models import Lease
from runlease.db.store import NewRun, Registration, RunStore
from runlease.db.threads import ThreadSubmit
from runlease.errors import ThreadBusy, ValidationError
from tests.integration.test_concurrency import run_threads
from tests.support.databases import ManualClock


async def submit(store: RunStore, tenant: str, thread: str, policy: str = "enqueue",
                 key: str | None = None, **input_: object) -> ThreadSubmit:
    async with store.connection() as conn, conn.transaction():
        out = await store.submit_to_thread(
            "default", NewRun(tenant, dict(input_), idempotency_key=key), thread, policy,
            conn=conn)
    if out.interrupt is not None:
        await store.interrupt(out.interrupt, tenant)
    return out


async def claim_all(store: RunStore, worker: str = "w", n: int = 50) -> list[Lease]:
    leases: list[Lease] = []
    for _ in range(3):
        leases += await store.claim("default", worker, n)
    return leases


async def test_one_run_of_a_thread_at_a_time_in_submit_order(store: RunStore) -> None:
    ids = [(await submit(store, "t", "conv-1", i=i)).result.run.id for i in range(5)]
    await store.enqueue("default", "t", {"other": True})
    order: list[UUID] = []
    for _ in range(5):
        leases = await claim_all(store)
        threaded = [le for le in leases if le.run.id in ids]
        assert len(threaded) == 1, threaded
        order.append(threaded[0].run.id)
        for le in leases:
            await store.ack(le)
    assert order == ids
    assert await claim_all(store) == []


async def test_a_thread_is_a_tenants_own(store: RunStore) -> None:
    a = (await submit(store, "a", "shared-name")).result.run
    b = (await submit(store, "b", "shared-name")).result.run
    leased = {le.run.id for le in await claim_all(store)}
    assert {a.id, b.id} <= leased  # two tenants' threads of one name are two threads
    thread = await store.get_thread("a", "shared-name")
    assert thread is not None
    assert thread.head_run_id == a.id
    assert [r.id for r in await store.thread_runs("a", "shared-name")] == [a.id]
    assert await store.get_thread("c", "shared-name") is None
    assert await store.thread_runs("c", "shared-name") == []


async def test_a_failed_head_retries_before_the_next_starts(store: RunStore,
                                                            clock: ManualClock) -> None:
    first = (await submit(store, "t", "c")).result.run
    second = (await submit(store, "t", "c")).result.run
    (lease,) = await claim_all(store)
    assert lease.run.id == first.id
    await store.nack(lease, "flaky", "try again")
    clock.advance(3600)
    (again,) = await claim_all(store, "w-later")
    assert again.run.id == first.id  # the head again, never the second meanwhile
    await store.fail(again, "broken", "no")
    (nxt,) = await claim_all(store, "w-later")
    assert nxt.run.id == second.id


async def test_reject_answers_the_active_run(store: RunStore) -> None:
    head = (await submit(store, "t", "c")).result.run
    with pytest.raises(ThreadBusy) as busy:
        await submit(store, "t", "c", "reject")
    assert busy.value.run_id == head.id
    assert [r.id for r in await store.thread_runs("t", "c")] == [head.id]
    await store.ack((await claim_all(store))[0])
    done = (await submit(store, "t", "c", "reject")).result.run  # idle again: accepted
    assert (await claim_all(store))[0].run.id == done.id


async def test_an_idempotent_repeat_changes_nothing(store: RunStore) -> None:
    one = await submit(store, "t", "c", key="k1")
    again = await submit(store, "t", "c", "reject", key="k1")
    assert not again.result.inserted
    assert again.result.run.id == one.result.run.id
    assert len(await store.thread_runs("t", "c")) == 1


async def test_interrupt_cancels_a_pending_head_at_once(store: RunStore) -> None:
    old = (await submit(store, "t", "c")).result.run
    new = (await submit(store, "t", "c", "interrupt")).result.run
    assert (await store.get(old.id)).status == "cancelled"
    (lease,) = await claim_all(store)
    assert lease.run.id == new.id


async def test_interrupt_asks_a_leased_head_to_stop_and_waits_for_it(store: RunStore) -> None:
    old = (await submit(store, "t", "c")).result.run
    (held,) = await claim_all(store)
    new = (await submit(store, "t", "c", "rollback")).result.run
    run = await store.get(old.id)
    assert run.cancel_requested_at is not None
    assert run.rolled_back
    assert await claim_all(store, "w2") == []  # the old one still holds the thread
    await store.finalize_cancel(held)
    (lease,) = await claim_all(store, "w2")
    assert lease.run.id == new.id
    assert not (await store.get(new.id)).rolled_back
    thread = await store.get_thread("t", "c")
    assert thread is not None
    assert thread.head_run_id == new.id
    assert thread.runs == 2


async def test_a_rolled_back_run_is_never_the_latest_answer(store: RunStore) -> None:
    first = (await submit(store, "t", "c")).result.run
    await store.ack((await claim_all(store))[0], {"answer": 1})
    second = (await submit(store, "t", "c")).result.run
    (held,) = await claim_all(store)
    assert held.run.id == second.id
    await submit(store, "t", "c", "rollback")
    await store.ack(held, {"answer": 2})  # it finished anyway: kept, flagged
    assert (await store.get(second.id)).rolled_back
    thread = await store.get_thread("t", "c")
    assert thread is not None
    assert thread.latest_run_id == first.id


async def test_cancelling_a_queued_run_keeps_the_order(store: RunStore) -> None:
    ids = [(await submit(store, "t", "c")).result.run.id for _ in range(3)]
    await store.request_cancel(ids[1])
    got = []
    for _ in range(2):
        (lease,) = await claim_all(store)
        got.append(lease.run.id)
        await store.ack(lease)
    assert got == [ids[0], ids[2]]


async def test_a_redriven_run_waits_behind_the_threads_head(store: RunStore) -> None:
    first = (await submit(store, "t", "c")).result.run
    (lease,) = await claim_all(store)
    await store.fail(lease, "broken", "no")
    second = (await submit(store, "t", "c")).result.run
    (held,) = await claim_all(store)
    assert held.run.id == second.id
    await store.redrive(first.id)
    assert await claim_all(store, "w2") == []  # the thread is busy
    await store.ack(held)
    (lease,) = await claim_all(store, "w2")
    assert lease.run.id == first.id


@pytest.mark.parametrize("thread", ["", "x" * 129, "a/b", "a b", "-lead", "ü", "a\x00b", 7])
async def test_hostile_thread_ids_are_refused(store: RunStore, thread: object) -> None:
    async with store.connection() as conn, conn.transaction():
        with pytest.raises(ValidationError) as refused:
            await store.submit_to_thread("default", NewRun("t", {}), thread, conn=conn)  # type: ignore[arg-type]
    assert refused.value.field == "thread_id"


async def test_an_unknown_policy_is_refused(store: RunStore) -> None:
    async with store.connection() as conn, conn.transaction():
        with pytest.raises(ValidationError):
            await store.submit_to_thread("default", NewRun("t", {}), "c", "steal", conn=conn)


async def test_the_schema_refuses_two_leased_runs_of_one_thread(db_url: str,
                                                                 store: RunStore) -> None:
    """The last line of defence: even written by hand, a second lease fails."""
    await submit(store, "t", "c")
    await submit(store, "t", "c")
    await claim_all(store)
    with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("UPDATE agent_runs SET status = 'leased', locked_by = 'w',"
                     " lease_epoch = 1, attempts = 1, delayed = false"
                     " WHERE thread_id = 'c' AND status = 'pending'")


THREADS = [(f"t{i % 2}", f"conv-{i}") for i in range(6)]
PER_THREAD = 24


class Race:
    """What the claimers, submitters and the sampler of the race share."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.stop = threading.Event()
        self.submitted = threading.Event()
        self.worst = 0
        self.samples = 0
        self.out_of_order: list[str] = []

    def sample(self) -> None:
        """The most leased runs of one thread, at every instant it looks."""
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            while not self.stop.is_set():
                (n,) = conn.execute(
                    "SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM agent_runs"
                    " WHERE status = 'leased' AND thread_id IS NOT NULL"
                    " GROUP BY tenant_id, thread_id) x").fetchone() or (0,)
                self.worst = max(self.worst, n)
                self.samples += 1

    def watch_submits(self) -> None:
        while not self.stop.is_set():
            with psycopg.connect(self.db_url) as conn:
                (n,) = conn.execute("SELECT count(*) FROM agent_runs").fetchone() or (0,)
            if n >= PER_THREAD * len(THREADS):
                self.submitted.set()
                return
            time.sleep(0.05)

    async def submitter(self, i: int) -> None:
        async with make_conn_pool(self.db_url, max_size=1) as conn_pool:
            store = RunStore(conn_pool)
            for k in range(PER_THREAD // 2):
                for tenant, thread in THREADS:
                    async with store.connection() as conn, conn.transaction():
                        await store.submit_to_thread(
                            "default", NewRun(tenant, {"k": k, "by": i}), thread, conn=conn)

    async def check_order(self, store: RunStore, leases: list[Lease]) -> None:
        """Every earlier run of each claimed run's thread has finished."""
        async with store.connection() as conn:
            for le in leases:
                row = await (await conn.execute(
                    "SELECT count(*) AS n FROM agent_runs r, agent_runs m"
                    " WHERE m.id = %s AND r.tenant_id = m.tenant_id"
                    "   AND r.thread_id = m.thread_id AND r.thread_seq < m.thread_seq"
                    "   AND r.finished_at IS NULL", (le.run_id,))).fetchone()
                if row and row["n"]:
                    self.out_of_order.append(str(le.run_id))

    async def claimer(self, i: int) -> None:
        if i >= 8:
            await self.submitter(i - 8)
            return
        dies = i == 0  # killed holding its leases: the reaper takes them
        async with make_conn_pool(self.db_url, max_size=1) as conn_pool:
            store = RunStore(conn_pool)
            worker = f"w{i}"
            await store.register_worker(Registration(worker, "default", 0),
                                        lease_s=1 if dies else 600)
            idle_since = time.monotonic()
            n = 0
            while time.monotonic() - idle_since < 3.0 or not self.submitted.is_set():
                if not dies:
                    await store.reap()
                leases = await store.claim("default", worker, 3)
                if not leases:
                    await asyncio.sleep(0.005)
                    continue
                idle_since = time.monotonic()
                await self.check_order(store, leases)
                if dies:
                    return
                await asyncio.sleep(0.002)
                for le in leases:
                    n += 1
                    if n % 7 == 0:
                        await store.release(worker, [(le.run_id, le.epoch)])
                    elif n % 5 == 0:
                        await store.fail(le, "broken", "fatal")
                    else:
                        await store.ack(le)


@pytest.mark.slow
def test_eight_claimers_never_lease_two_runs_of_a_thread(db_url: str) -> None:
    """Invariant 11 under contention: 8 claimers on their own connections, 2
    submitters adding to the same threads meanwhile, one claimer that dies
    holding its leases (reaped, its runs claimed again), acks, fatal fails
    and releases; a sampler never sees two leased runs of one thread, and
    each run starts only after every earlier run of its thread finished."""
    race = Race(db_url)
    helpers = [threading.Thread(target=race.sample), threading.Thread(target=race.watch_submits)]
    for h in helpers:
        h.start()
    try:
        run_threads(10, race.claimer)
    finally:
        race.stop.set()
        race.submitted.set()
        for h in helpers:
            h.join()
    assert race.samples > 50
    assert race.worst == 1  # reached, never passed
    assert race.out_of_order == []
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM agent_runs GROUP BY 1 ORDER BY 1").fetchall()
        seqs = conn.execute(
            "SELECT tenant_id, thread_id, array_agg(thread_seq ORDER BY thread_seq)"
            "  FROM agent_runs GROUP BY 1, 2").fetchall()
    assert sum(n for _, n in rows) == PER_THREAD * len(THREADS)
    assert {s for s, _ in rows} <= {"done", "dead"}  # every run finished
    for _, _, got in seqs:  # submit order numbered without gaps or repeats
        assert got == list(range(1, PER_THREAD + 1))


async def test_a_claimed_run_carries_its_thread(store: RunStore) -> None:
    mine = (await submit(store, "t", "conv-9")).result.run
    await store.enqueue("default", "t", {})
    by_id = {le.run.id: le.run.thread_id for le in await claim_all(store)}
    assert by_id.pop(mine.id) == "conv-9"
    assert list(by_id.values()) == [None]
