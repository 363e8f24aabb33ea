"""The core promise at its edges (issue 11): one attempt at a time in every
process, no poisoned ack batch, no write after the fence, wake-ups that are
not lost, lease-health metrics that count what they say. Real workers, a real
PostgreSQL, faults forced from SQL."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
import pytest

from runlease.db.store import RunStore
from runlease.worker import RunContext
from tests.support.waiting import until
from tests.support.workers import running_worker

FAST = {"lease_s": 3, "heartbeat_interval_s": 0.5, "reaper": False, "concurrency": 2}


async def _force_reap(db_url: str, run_id: UUID) -> None:
    """Expire the incarnation holding one run and reap it in the same
    transaction: no heartbeat can slip in between and renew it. The holder's
    worker learns at its next heartbeat that the incarnation is over."""
    from runlease.db.channels import EVENTS_CHANNEL
    from runlease.db.queries import sql

    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        await conn.execute(
            "UPDATE agent_run_workers SET expires_at = now() - interval '1 second'"
            " WHERE id = (SELECT locked_by FROM agent_runs WHERE id = %s)", (run_id,))
        await conn.execute(sql("run_reap"), {"batch": 10, "channel_prefix": "runlease_pool_",
                                             "events_channel": EVENTS_CHANNEL, "now": None})
        await conn.commit()


@dataclass
class Attempt:
    epoch: int
    started: float
    ended: float | None = None
    lost: bool | None = None
    outcome: str = "running"


@dataclass
class Recorder:
    """What an agent saw, attempt by attempt, and how many ran at once."""

    attempts: list[Attempt] = field(default_factory=list)
    running: int = 0
    most: int = 0


def stubborn_agent(rec: Recorder, seconds: float) -> Any:
    async def agent(ctx: RunContext) -> dict[str, Any]:
        me = Attempt(ctx.lease_epoch, time.monotonic())
        rec.attempts.append(me)
        rec.running += 1
        rec.most = max(rec.most, rec.running)
        try:
            await asyncio.sleep(seconds)
            me.outcome = "returned"
            return {"epoch": ctx.lease_epoch}
        except asyncio.CancelledError:
            me.lost = ctx.lease_lost
            # Ignore the cancellation for a moment, as agent code stuck in a
            # cleanup would.
            await asyncio.sleep(0.5)
            me.outcome = "cancelled"
            raise
        finally:
            me.ended = time.monotonic()
            rec.running -= 1

    return agent


async def test_a_reclaimed_run_keeps_its_own_handle(live_store: RunStore, db_url: str) -> None:
    """The reaper hands a run back and the same worker claims it again while
    the old attempt still unwinds: the old attempt is told its lease is gone
    and ends before the new one starts; the new one is heartbeated and acks."""
    rec = Recorder()
    queued = await live_store.enqueue("default", "acme", {}, max_attempts=3)
    run_id = queued.run.id
    async with running_worker(db_url, stubborn_agent(rec, 5.0), **FAST) as a:
        await until(lambda: _leased(live_store, run_id, epoch=1), what="attempt 1 leased")
        await until(lambda: asyncio.sleep(0, bool(rec.attempts)), what="attempt 1 started")
        await _force_reap(db_url, run_id)
        first_holder = (await live_store.get(run_id)).locked_by
        # Its next heartbeat finds the incarnation over: the worker fences
        # its runs, registers a new incarnation and takes the run again.
        second = await until(lambda: _leased(live_store, run_id, epoch=2),
                             what="attempt 2 leased by the same worker")
        assert second.locked_by.startswith(a.identity + ":")
        assert second.locked_by != first_holder
        # Another worker is ready, and reaps whatever is not renewed.
        async with running_worker(db_url, stubborn_agent(rec, 5.0), **(FAST | {
                "reaper": True, "reaper_interval_s": 0.2})):
            run = await until(lambda: _finished(live_store, run_id), timeout_s=30,
                              what="the run to finish")
            expiries = [n for (n,) in await _query(
                db_url, "SELECT count(*) FROM agent_run_events WHERE run_id = %s"
                        " AND kind = 'run.lease_expired'", run_id)]
    assert run.status == "done", (run.status, run.error_code, rec.attempts)
    assert run.attempts == 2, rec.attempts
    assert run.result_json == {"epoch": 2}
    assert expiries == [1], "only the forced reap expired a lease: attempt 2 was renewed"
    first, last = rec.attempts
    assert first.lost is True
    assert first.outcome == "cancelled"
    assert (last.outcome, last.epoch) == ("returned", 2)
    assert first.ended is not None
    assert first.ended <= last.started, "attempts overlapped"
    assert rec.most <= FAST["concurrency"]
    assert rec.most == 1, "the new attempt waits for the old one to end"


async def test_a_reclaim_keeps_the_old_attempt_counted(live_store: RunStore,
                                                       db_url: str) -> None:
    """While an old attempt unwinds, it holds its slot: a worker of
    concurrency 2 with one run unwinding and its new attempt waiting claims
    nothing more."""
    rec = Recorder()
    first = await live_store.enqueue("default", "acme", {}, max_attempts=3)
    async with running_worker(db_url, stubborn_agent(rec, 5.0), **FAST) as w:
        await until(lambda: _leased(live_store, first.run.id, epoch=1), what="leased")
        await until(lambda: asyncio.sleep(0, bool(rec.attempts)), what="started")
        await _force_reap(db_url, first.run.id)
        await until(lambda: _leased(live_store, first.run.id, epoch=2), what="re-leased")
        assert w.executing == 2
        other = await live_store.enqueue("default", "acme", {})
        # The old attempt ends 0.5 s after its cancel; only then is a slot free.
        await until(lambda: _leased(live_store, other.run.id, epoch=1), what="other leased")
        assert rec.attempts[0].ended is not None
        assert w.executing <= 2


async def _leased(store: RunStore, run_id: UUID, *, epoch: int) -> Any:
    run = await store.get(run_id)
    return run if run.status == "leased" and run.lease_epoch == epoch else None


async def _finished(store: RunStore, run_id: UUID) -> Any:
    run = await store.get(run_id)
    return run if run.status in ("done", "dead", "cancelled") else None


async def _query(db_url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute(sql, args)
        return await cur.fetchall() if cur.description is not None else []


pytestmark = pytest.mark.timeout(120)


# -- 2. one bad result does not hold up the others -----------------------------------


async def mixed_results(ctx: RunContext) -> Any:
    """Results a hostile or buggy agent returns, beside good ones."""
    await ctx.sleep(0.3)  # the whole batch finishes together: one ack batch
    kind = ctx.input.get("kind")
    if kind == "big":
        return {"blob": "x" * 300_000}
    if kind == "nan":
        return {"value": float("nan")}
    if kind == "code":
        from runlease.worker import RetryableError

        raise RetryableError("rate limited by sk-abcdefghijklmnopqrstuvwxyz123456",
                             code="HTTP 429 Too Many Requests!")
    if kind == "secret":
        return {"dsn": "postgresql://app:hunter2hunter2@db:5432/x"}
    return {"ok": ctx.input["i"]}


async def test_one_bad_result_does_not_hold_up_the_others(live_store: RunStore,
                                                          db_url: str) -> None:
    from runlease.db.store import NewRun

    good = [NewRun("acme", {"i": i}) for i in range(40)]
    bad = [NewRun("acme", {"kind": k}, max_attempts=3) for k in ("big", "nan", "code", "secret")]
    queued = await live_store.enqueue_many("default", good + bad)
    ids = [q.run.id for q in queued]
    async with running_worker(db_url, mixed_results, concurrency=50, lease_s=60,
                              heartbeat_interval_s=10):
        async def settled() -> Any:
            runs = [await live_store.get(i) for i in ids]
            return runs if all(r.attempts >= 1 and r.status != "leased" for r in runs) else None

        runs = await until(settled, timeout_s=30, what="every run to leave leased")
    by_kind = {r.input_json.get("kind", "good"): r for r in runs}
    assert [r.status for r in runs[:40]] == ["done"] * 40
    assert [r.result_json for r in runs[:40]] == [{"ok": i} for i in range(40)]
    assert (by_kind["big"].status, by_kind["big"].error_code) == ("dead", "result_too_large")
    assert (by_kind["nan"].status, by_kind["nan"].error_code) == ("dead", "result_not_json")
    odd = by_kind["code"]
    assert (odd.status, odd.error_code) == ("pending", "invalid_error_code")
    assert odd.error_message is not None
    assert "HTTP 429 Too Many Requests!" in odd.error_message
    assert "sk-abcdefghijklmnop" not in odd.error_message  # redacted
    assert by_kind["secret"].status == "done"
    assert "hunter2" not in str(by_kind["secret"].result_json)  # results are redacted too


async def test_ack_many_fails_only_the_bad_items(store: RunStore) -> None:
    from runlease.db.store import NewRun

    await store.enqueue_many("default", [NewRun("acme", {"i": i}) for i in range(4)])
    leases = await store.claim("default", "w", 4)
    lost = await store.ack_many([(leases[0], {"a": 1}), (leases[1], {"n": float("inf")}),
                                 (leases[2], {"b": "y" * 300_000}), (leases[3], None)])
    assert lost == set()
    runs = [await store.get(lease.run_id) for lease in leases]
    assert [(r.status, r.error_code) for r in runs] == [
        ("done", None), ("dead", "result_not_json"), ("dead", "result_too_large"),
        ("done", None)]


# -- 7. no write after the fence --------------------------------------------------------


async def blocks_the_loop(ctx: RunContext) -> dict[str, Any]:
    if ctx.attempt == 1:
        time.sleep(3.5)  # noqa: ASYNC251 - the point: agent code that blocks the loop
    return {"attempt": ctx.attempt}


async def test_an_agent_that_blocks_the_loop_is_fenced_not_acked(live_store: RunStore,
                                                                 db_url: str) -> None:
    """The event loop was blocked past the lease: the worker saw the delay,
    exported it, and fenced the attempt instead of acking it late."""
    from runlease.db.embedded import free_port

    port = free_port()
    scrape = Scrape(port)
    async with running_worker(db_url, blocks_the_loop, lease_s=3, heartbeat_interval_s=0.5,
                              reaper_interval_s=0.2, leader_ttl_s=10, metrics_port=port,
                              metrics_host="127.0.0.1") as w:
        before = await scrape.read()
        queued = await live_store.enqueue("default", "acme", {}, max_attempts=3)
        run = await until(lambda: _finished(live_store, queued.run.id), timeout_s=30,
                          what="the run to finish")
        assert w.keeper.max_delay_s >= 2.5
        after = await scrape.read()
        async with __import__("httpx").AsyncClient() as http:
            text = (await http.get(scrape.url)).text
    assert (run.status, run.attempts, run.result_json) == ("done", 2, {"attempt": 2})
    # Fenced by its own clock, reaped by the leader; the late renewal (if one
    # was sent) is refused: never more than one stale write.
    moved = _moved(before, after)
    assert moved.pop("stale_writes_rejected", 1) == 1
    assert moved == {"self_fenced": 1, "reaped": 1}
    assert 'runlease_heartbeat_delay_seconds_bucket{le="2.5",pool="default"}' in text


async def emits_forever(ctx: RunContext) -> None:
    await ctx.emit("started", {})
    while True:
        await ctx.delta("tick ")
        await ctx.emit("tick", {})
        await asyncio.sleep(0.05)


async def test_no_write_lands_after_the_fence_when_the_network_returns(
        live_store: RunStore, db_url: str) -> None:
    from psycopg import conninfo

    from tests.support.proxy import CuttableProxy

    params = conninfo.conninfo_to_dict(db_url)
    proxy = CuttableProxy(str(params.get("host", "127.0.0.1")), int(params["port"]))
    queued = await live_store.enqueue("default", "acme", {}, max_attempts=1)
    run_id = queued.run.id
    try:
        async with running_worker(proxy.url_for(db_url), emits_forever, lease_s=3,
                                  heartbeat_interval_s=0.5, listen=False, reaper=False) as w:
            await until(lambda: _events(db_url, run_id, 5), what="events flowing")
            proxy.cut()
            (cut_at,) = (await _query(db_url, "SELECT now()"))[0]
            # Wait until the lease has expired by the database clock (nobody
            # reaps it: no reaper runs), with writes queued behind the cut.
            await until(lambda: _expired(db_url, run_id), timeout_s=15, what="lease expiry")
            proxy.restore()
            await until(lambda: asyncio.sleep(0, w.executing == 0), timeout_s=30,
                        what="the attempt to end")
            late = await _query(db_url, "SELECT count(*) FROM agent_run_events"
                                        " WHERE run_id = %s AND created_at > %s", run_id, cut_at)
    finally:
        proxy.close()
    assert late == [(0,)], "a write landed after the fence"
    run = await live_store.get(run_id)
    assert run.status == "leased"  # left for the reaper: nothing was written


async def _events(db_url: str, run_id: UUID, n: int) -> bool:
    rows = await _query(db_url, "SELECT count(*) FROM agent_run_events WHERE run_id = %s",
                        run_id)
    return bool(rows[0][0] >= n)


async def _expired(db_url: str, run_id: UUID) -> bool:
    rows = await _query(db_url, "SELECT w.expires_at < now() FROM agent_runs r"
                                " JOIN agent_run_workers w ON w.id = r.locked_by"
                                " WHERE r.id = %s", run_id)
    return bool(rows[0][0])


# -- 9. wake-ups that are not lost -----------------------------------------------------


async def test_a_finished_run_wakes_a_claimer_of_its_capped_tenant(live_store: RunStore,
                                                                   db_url: str) -> None:
    from runlease.db.models import Pool

    await live_store.put_pool(Pool("default"), {"acme": 1})
    first = await live_store.enqueue("default", "acme", {"i": 1})
    (lease,) = await live_store.claim("default", "elsewhere", 1)
    second = await live_store.enqueue("default", "acme", {"i": 2})
    from prometheus_client import REGISTRY

    def claims() -> float:
        return REGISTRY.get_sample_value("runlease_claim_latency_seconds_count",
                                         {"pool": "default"}) or 0.0

    before = claims()
    # This worker polls once a minute: only a NOTIFY can make it claim soon.
    async with running_worker(db_url, stubborn_agent(Recorder(), 0.1), poll_interval_s=60,
                              reaper=False):
        await until(lambda: asyncio.sleep(0, claims() > before), what="a first claim")
        assert (await live_store.get(second.run.id)).status == "pending"  # acme is capped
        await live_store.ack(lease, {"done": True})
        run = await until(lambda: _finished(live_store, second.run.id), timeout_s=20,
                          what="the capped tenant's next run, claimed on the ack's NOTIFY")
    assert first.run.id == lease.run_id
    assert run.status == "done"


async def test_a_cancel_that_overtakes_the_claim_is_applied_at_start(live_store: RunStore,
                                                                    db_url: str) -> None:
    """The cancel's NOTIFY reaches the worker between the claim's commit and the
    run's start: the run is cancelled before its agent runs a line."""
    started: list[int] = []

    async def agent(ctx: RunContext) -> None:
        started.append(ctx.attempt)
        await ctx.sleep(60)

    queued = await live_store.enqueue("default", "acme", {})
    async with running_worker(db_url, agent, lease_s=60, heartbeat_interval_s=20,
                              reaper=False) as w:
        claim = w.store.claim

        async def claim_then_cancel(*args: Any, **kwargs: Any) -> Any:
            leases = await claim(*args, **kwargs)
            for lease in leases:
                run_id = lease.run_id
                await live_store.request_cancel(run_id)
                await until(lambda: asyncio.sleep(0, run_id in w._early_cancels),  # noqa: B023
                            what="the cancel NOTIFY to arrive first")
            return leases

        w.store.claim = claim_then_cancel  # type: ignore[method-assign]
        w._wake.set()
        run = await until(lambda: _finished(live_store, queued.run.id), timeout_s=15,
                          what="the run to end")
    assert run.status == "cancelled"
    assert started == []


# -- 10. lease-health metrics that count what they say ---------------------------------


class Scrape:
    """Counters read from a worker's own /metrics endpoint, as Prometheus would."""

    NAMES = ("runlease_stale_writes_rejected_total", "runlease_leases_lost_total",
             "runlease_self_fenced_total", "runlease_reaped_total")

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"

    async def read(self) -> dict[str, float]:
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        async with httpx.AsyncClient() as http:
            text = (await http.get(self.url)).text
        values = dict.fromkeys(self.NAMES, 0.0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in values and sample.labels.get("pool") == "default":
                    values[sample.name] += sample.value
        return values


def _moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k.removeprefix("runlease_").removesuffix("_total"): after[k] - before[k]
            for k in before if after[k] != before[k]}


async def test_metrics_count_each_forced_fault_exactly(live_store: RunStore,
                                                       db_url: str) -> None:
    from runlease.db.embedded import free_port

    go = asyncio.Event()
    wrote: list[str] = []

    async def agent(ctx: RunContext) -> None:
        if ctx.input.get("write_late"):
            await go.wait()
            try:
                await ctx.emit("late", {})
            finally:
                wrote.append("tried")
        await ctx.sleep(60)

    port = free_port()
    scrape = Scrape(port)
    async with running_worker(db_url, agent, metrics_port=port, metrics_host="127.0.0.1",
                              lease_s=30, heartbeat_interval_s=0.5, reaper=True,
                              reaper_interval_s=0.2) as w:
        # Lease loss found by a renewal: the holder's incarnation expired
        # (from SQL), so the renewal is refused, or the reaper ends it first
        # and then it is.
        lost = await live_store.enqueue("default", "acme", {}, max_attempts=1)
        await until(lambda: _leased(live_store, lost.run.id, epoch=1), what="leased")
        before = await scrape.read()
        await _query(db_url, "UPDATE agent_run_workers SET expires_at = now() - interval '1 s'"
                             " WHERE id = (SELECT locked_by FROM agent_runs WHERE id = %s)",
                     lost.run.id)
        await until(lambda: asyncio.sleep(0, not w.active), what="the attempt to stop")
        await until(lambda: _finished(live_store, lost.run.id), what="the reap")
        assert _moved(before, await scrape.read()) == {
            "stale_writes_rejected": 1, "leases_lost": 1, "reaped": 1}

    # A stale write: the run was reaped from SQL while its agent was about to
    # emit. No renewal runs meanwhile (one each 30 s): with one in flight, both
    # it and the emit would be refused, two stale writes of one lost lease.
    # One slot, held by the run: no claim asks meanwhile either (a claim of an
    # ended incarnation would also tell the worker and stop the run first).
    async with running_worker(db_url, agent, metrics_port=port, metrics_host="127.0.0.1",
                              lease_s=120, heartbeat_interval_s=30, reaper=False,
                              concurrency=1) as w:
        stale = await live_store.enqueue("default", "acme", {"write_late": True},
                                         max_attempts=1)
        await until(lambda: _leased(live_store, stale.run.id, epoch=1), what="leased")
        before = await scrape.read()
        await _force_reap(db_url, stale.run.id)
        go.set()
        await until(lambda: asyncio.sleep(0, bool(wrote) and not w.active),
                    what="the late write and the attempt's end")
        moved = _moved(before, await scrape.read())
        # The emit, refused: one stale write, one lost lease.
        assert moved == {"stale_writes_rejected": 1, "leases_lost": 1}
