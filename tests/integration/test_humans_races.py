"""Invariant 12 at the store, with several real connections: a waiting run
holds no lease, is never reaped or claimed, and its answer is applied
exactly once, whatever races it (duplicate answers, another answer, a
cancel, the timeout)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest

from runlease.db.humans import InputRefused
from runlease.db.keys import KeyLimits
from runlease.errors import InvalidTransition
from tests.support.databases import RegisteringStore


async def parked(store: RegisteringStore, worker: str, *, timeout_s: float | None = None,
                 tenant: str = "acme") -> object:
    run = (await store.enqueue("default", tenant, {"steps": []}, max_attempts=1)).run
    [lease] = await store.claim("default", worker)
    assert lease.run_id == run.id
    status = await store.wait_input(lease, "approve", prompt="ok?",
                                    schema={"type": "boolean"}, timeout_s=timeout_s)
    assert status == "waiting"
    return run.id


async def test_concurrent_answers_and_a_cancel_apply_one_outcome(
    live_store: RegisteringStore, db_url: str
) -> None:
    outcomes: dict[str, int] = {}
    for i in range(25):
        run_id = await parked(live_store, f"w{i}")

        async def answer(value: bool, rid: object = run_id) -> str:
            try:
                return "resumed" if await live_store.give_input(
                    rid, "approve", value, tenant_id="acme") else "repeat"  # type: ignore[arg-type]
            except InputRefused:
                return "refused"

        async def cancel(rid: object = run_id) -> str:
            try:
                run = await live_store.request_cancel(rid, tenant_id="acme", strict=True)  # type: ignore[arg-type]
            except InvalidTransition:
                return "cancel-late"
            return "cancelled" if run.status == "cancelled" else "cancel-requested"

        results = await asyncio.gather(answer(True), answer(True), answer(True),
                                       answer(False), cancel())
        run = await live_store.get(run_id)  # type: ignore[arg-type]
        steps = await live_store.get_steps(run_id)  # type: ignore[arg-type]
        answered = [e for e in await live_store.events_after(run_id)  # type: ignore[arg-type]
                    if e.kind == "input.answered"]
        assert results.count("resumed") <= 1, results
        if results.count("resumed") == 1:
            # Once: one step, one event; repeats of the same value are no-ops,
            # the other value refused, the cancel then requested or applied.
            assert len(answered) == 1
            assert "input:approve" in steps
            value = answered[0].data["value"]
            assert steps["input:approve"].result == {"value": value}
            assert results.count("refused") >= 1
            assert run.status in ("pending", "cancelled")
            outcomes["answered"] = outcomes.get("answered", 0) + 1
        else:
            # The cancel came first: no answer applied, nothing to resume.
            assert results[4] == "cancelled"
            assert run.status == "cancelled"
            assert answered == []
            assert "input:approve" not in steps
            assert set(results[:4]) == {"refused"}
            outcomes["cancelled"] = outcomes.get("cancelled", 0) + 1
    assert sum(outcomes.values()) == 25


async def test_a_waiting_run_is_neither_claimed_nor_reaped(
    store: RegisteringStore, clock: object, db_url: str
) -> None:
    run_id = await parked(store, "w-old")
    clock.advance(3600)  # type: ignore[attr-defined]  # far past every lease
    reaped = await store.reap()
    assert reaped.total == 0
    assert await store.claim("default", "w-new") == []
    run = await store.get(run_id)  # type: ignore[arg-type]
    assert (run.status, run.locked_by, run.attempts) == ("waiting", None, 0)
    with psycopg.connect(db_url, autocommit=True) as conn:
        # Invariant 12: no row holds it, no count of leased runs has it.
        assert conn.execute("SELECT count(*) FROM agent_runs WHERE status = 'leased'"
                            ).fetchone() == (0,)


async def test_a_request_times_out_once_and_the_next_attempt_sees_it(
    store: RegisteringStore, clock: object
) -> None:
    run_id = await parked(store, "w1", timeout_s=60)
    assert await store.time_out_inputs() == []  # not yet
    clock.advance(61)  # type: ignore[attr-defined]
    [(rid, pool, tenant, name)] = await store.time_out_inputs()
    assert (rid, pool, tenant, name) == (run_id, "default", "acme", "approve")
    assert await store.time_out_inputs() == []  # once
    run = await store.get(run_id)  # type: ignore[arg-type]
    assert run.status == "pending"
    assert run.available_at <= clock.db_now()
    steps = await store.get_steps(run_id)  # type: ignore[arg-type]
    assert steps["input:approve"].result == {"timed_out": True}
    with pytest.raises(InputRefused, match="timed out"):
        await store.give_input(run_id, "approve", True, tenant_id="acme")  # type: ignore[arg-type]


async def test_a_cancelled_runs_request_is_closed_by_the_timeout_pass(
    store: RegisteringStore, clock: object
) -> None:
    run_id = await parked(store, "w1", timeout_s=60)
    await store.request_cancel(run_id)  # type: ignore[arg-type]
    clock.advance(61)  # type: ignore[attr-defined]
    assert await store.time_out_inputs() == []
    [request] = await store.input_requests(run_id)  # type: ignore[arg-type]
    assert (request.outcome, request.open) == ("closed", False)
    assert (await store.get(run_id)).status == "cancelled"  # type: ignore[arg-type]


async def test_an_answer_waits_for_nothing_held(store: RegisteringStore, clock: object) -> None:
    """The lease's time does not matter to a waiting run: answered an hour
    after its worker's incarnation expired, it is claimable at once."""
    run_id = await parked(store, "w-gone")
    clock.advance(3600)  # type: ignore[attr-defined]
    assert await store.give_input(run_id, "approve", False)  # type: ignore[arg-type]
    [lease] = await store.claim("default", "w-next")
    assert lease.run_id == run_id
    assert lease.run.attempts == 1
    assert (await store.get(run_id)).available_at <= clock.db_now() + timedelta(0)  # type: ignore[arg-type,attr-defined]


async def test_waiting_runs_are_counted_as_waiting_not_pending(
    store: RegisteringStore, clock: object
) -> None:
    await parked(store, "w1")
    await parked(store, "w2", tenant="globex")
    await store.enqueue("default", "acme", {"steps": []})
    for _ in range(2):  # before and after the leader's fold
        stats = await store.queue_stats("default")
        assert stats.waiting_by_tenant == {"acme": 1, "globex": 1}
        assert stats.by_tenant["acme"][:2] == (1, 1)  # the one pending run only
        assert stats.pending == 1
        counts = await store.status_counts(tenant_id="acme")
        assert counts.by_status == {"pending": 1, "waiting": 1}
        await store.fold_counts()


async def test_a_waiting_run_is_its_threads_active_run(store: RegisteringStore,
                                                     db_url: str) -> None:
    """Invariant 11 with waiting: the thread's next run starts only when the
    waiting one finishes, and the database refuses a second active run."""
    from runlease.db.runs import NewRun

    async def to_thread(text: str) -> object:
        async with store.connection() as conn, conn.transaction():
            joined = await store.submit_to_thread("default", NewRun("acme", {"t": text}),
                                                  "conv-1", conn=conn)
        return joined.result.run.id

    first = await to_thread("first")
    [lease] = await store.claim("default", "w1")
    assert lease.run_id == first
    await store.wait_input(lease, "approve", prompt=None, schema=None, timeout_s=None)
    second = await to_thread("second")
    assert await store.claim("default", "w2") == []  # the thread is busy: waiting
    with psycopg.connect(db_url, autocommit=True) as conn, \
            pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("UPDATE agent_runs SET status = 'waiting' WHERE id = %s", (second,))
    assert await store.give_input(first, "approve", "go on")  # type: ignore[arg-type]
    [again] = await store.claim("default", "w2")
    assert again.run_id == first  # the head again, not the next run
    await store.ack(again, {"ok": True})
    [nxt] = await store.claim("default", "w3")
    assert nxt.run_id == second


async def test_a_waiting_run_gives_its_key_slot_to_the_next(store: RegisteringStore) -> None:
    """A waiting run holds no concurrency-key slot either: the key's parked
    run takes it; the answer takes one again, or parks the answered run."""
    from runlease.db.runs import NewRun

    await store.replace_key_limits("default", KeyLimits(default=1))

    async def keyed(text: str) -> object:
        async with store.connection() as conn, conn.transaction():
            (result,) = await store.enqueue_many("default", [NewRun("acme", {"t": text})],
                                                 conn=conn)
            run = await store.join_key(result.run.id, "repo-1", conn=conn)
        return run.id

    first, second = await keyed("first"), await keyed("second")
    [lease] = await store.claim("default", "w1")
    assert lease.run_id == first
    assert await store.claim("default", "w2") == []  # the key is at its limit
    await store.wait_input(lease, "approve", prompt=None, schema=None, timeout_s=None)
    [nxt] = await store.claim("default", "w2")
    assert nxt.run_id == second  # the slot went on
    assert await store.give_input(first, "approve", "ok")  # type: ignore[arg-type]
    assert await store.claim("default", "w3") == []  # answered, but parked: key full
    await store.ack(nxt, {"ok": True})
    [back] = await store.claim("default", "w3")
    assert back.run_id == first
