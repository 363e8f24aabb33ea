"""The console's history and figures: who held each lease of a run, a pool's
lease expiries and stale writes over the last hour, and counts per status
over every run of the viewer's scope (from the maintained counts)."""

from __future__ import annotations

import re
from uuid import UUID

import pytest

from runlease.api.console.attempts import attempts
from runlease.clock import ManualClock
from runlease.db.models import Pool
from runlease.db.store import Registration, RunStore
from runlease.errors import LeaseLost, ValidationError
from tests.console.test_console_http import signed_in
from tests.support.api import Api

WORKER_A = "pod-a:boot-a:101"
WORKER_B = "pod-b:boot-b:202"


def attempt_rows(html: str) -> list[str]:
    table = re.search(r'<table class="attempts" id="attempts">(.*?)</table>', html, re.S)
    assert table, "no attempts table on the page"
    return [re.sub(r"<[^>]+>", " ", row) for row in re.findall(r"<tr><td>(.*?)</tr>",
                                                                 table.group(1), re.S)]


def counts_shown(html: str) -> dict[str, int]:
    return {s: int(n) for s, n in re.findall(
        r'class="badge (\w+)" href="[^"]*">\w+ <b>(\d+)</b>', html)}


async def test_a_run_reaped_from_one_worker_and_finished_by_another_shows_both(
        ui: Api, store: RunStore, clock: ManualClock) -> None:
    run = (await store.enqueue("default", "acme", {"task": "long"})).run
    theirs = (await store.enqueue("default", "globex", {"task": "other"})).run
    (first,) = await store.claim("default", WORKER_A, 1, lease_s=30)
    assert first.run_id == run.id
    clock.advance(31)  # worker A stops renewing: the lease expires, the reaper hands it back
    assert (await store.reap()).to_pending == 1
    with pytest.raises(LeaseLost):
        await store.ack(first, {"late": True})
    clock.advance(10)  # the retry is due (available_at is the reap's instant)
    claimed = await store.claim("default", WORKER_B, 2, lease_s=30)
    second = next(c for c in claimed if c.run_id == run.id)
    await store.ack(second, {"answer": 42})

    async with signed_in(ui, "admin") as admin:
        page = await admin.get(f"/ui/runs/{run.id}")
        assert page.status_code == 200
        rows = attempt_rows(page.text)
        assert len(rows) == 2
        assert WORKER_A in rows[0]
        assert "lease expired" in rows[0]
        assert "lease_expired" in rows[0]
        assert WORKER_B in rows[1]
        assert "done" in rows[1]
        assert rows[0].startswith("1 ")
        assert rows[1].startswith("2 ")
    async with signed_in(ui, "acme") as tenant:
        page = await tenant.get(f"/ui/runs/{run.id}")
        rows = attempt_rows(page.text)
        # The tenant sees its run's attempts and how they ended, not the
        # fleet's worker identities (as the API shows the lease to admins only).
        assert len(rows) == 2
        assert "lease expired" in rows[0]
        assert "done" in rows[1]
        assert WORKER_A not in page.text
        assert WORKER_B not in page.text
        assert (await tenant.get(f"/ui/runs/{theirs.id}")).status_code == 404
        assert (await tenant.get(f"/ui/runs/{theirs.id}/summary")).status_code == 404


async def test_attempts_match_their_endings_by_seq(store: RunStore, clock: ManualClock) -> None:
    run = (await store.enqueue("default", "acme", {"task": "flaky"}, max_attempts=3)).run
    (lease,) = await store.claim("default", WORKER_A, 1)
    # Agent code cannot forge a lifecycle event (it would end the attempt early).
    with pytest.raises(ValidationError):
        await store.record_event(lease, "run.retrying", {"forged": "by agent code"})
    await store.record_event(lease, "tool_call", {"name": "search"})
    await store.nack(lease, "rate_limited", "try later")
    clock.advance(3600)
    (lease,) = await store.claim("default", WORKER_B, 1)
    now = await store.get(run.id)
    history = attempts(now, await store.holders(run.id), await store.lifecycle(run.id))
    assert [(a.worker, a.attempt, a.outcome) for a in history] == [
        (WORKER_A, 1, "failed, retried"), (WORKER_B, 2, "running")]
    assert history[0].error_code == "rate_limited"
    assert history[0].started is not None
    assert history[0].ended is not None
    assert history[1].ended is None


async def test_pools_page_shows_last_hour_expiries_and_stale_writes(
        ui: Api, store: RunStore, clock: ManualClock) -> None:
    # A pool of its own: stale writes not yet reported are counted per pool
    # in this process, and other tests' pools must not leak into it.
    await store.upsert_pool(Pool(name="health"))
    await store.enqueue("health", "acme", {"task": "will be reaped"})
    (lease,) = await store.claim("health", WORKER_A, 1, lease_s=30)
    clock.advance(31)
    assert (await store.reap()).to_pending == 1
    with pytest.raises(LeaseLost):  # worker A writes after its lease was taken: stale
        await store.record_event(lease, "note", {"late": True})
    # Worker A's incarnation was ended by the reap: its heartbeat finds
    # nothing to renew, and the stale write waits for the next incarnation's
    # beat, which carries it into its registry row; the reaper's leader
    # folds it into the pool's minute.
    assert await store.heartbeat(Registration(WORKER_A, "health", 1), lease_s=30) is None
    again = f"{WORKER_A}:again"
    await store.incarnation(again, "health", lease_s=30)
    assert await store.heartbeat(Registration(again, "health", 1), lease_s=30) is not None
    assert await store.fold_stale_writes() == 1
    assert await store.fold_stale_writes() == 0  # moved once
    # Another, reported by a heartbeat that renews a lease.
    await store.enqueue("health", "acme", {"task": "held"})
    (held,) = await store.claim("health", again, 1, lease_s=30)
    with pytest.raises(LeaseLost):
        await store.ack(lease)
    renewed = await store.heartbeat(Registration(again, "health", 1), lease_s=30, runs_held=1)
    assert renewed is not None
    assert held.run_id not in renewed.cancel_requested
    assert await store.fold_stale_writes() == 1
    health = (await store.pool_health(3600, "health"))["health"]
    assert (health.lease_expiries, health.stale_writes) == (1, 2)
    async with signed_in(ui, "admin") as admin:
        page = await admin.get("/ui/pools")
        section = page.text[page.text.index('id="pool-'):]
        section = section[section.index(">health"):]
        assert re.search(r'class="expiries">1<', section)
        assert re.search(r'class="stale-writes">2<', section)
        live = await admin.get("/ui/pools/health/stats", headers={"HX-Request": "true"})
        assert 'class="expiries">1<' in live.text
        assert 'class="stale-writes">2<' in live.text
    # An hour and more later, the last hour holds none of it.
    clock.advance(2 * 3600)
    assert await store.pool_health(3600, "health") == {}


async def test_counts_cover_every_run_of_the_scope(ui: Api, store: RunStore,
                                                   clock: ManualClock) -> None:
    async def enqueue(tenant: str, n: int) -> list[UUID]:
        return [(await store.enqueue("default", tenant, {"i": i}, max_attempts=1)).run.id
                for i in range(n)]

    await enqueue("acme", 6)
    await enqueue("globex", 4)
    leases = await store.claim("default", WORKER_A, 10)
    acme = [x for x in leases if x.run.tenant_id == "acme"]
    globex = [x for x in leases if x.run.tenant_id == "globex"]
    await store.ack(acme[0])
    await store.ack(acme[1])
    await store.fail(acme[2], "boom", "failed")
    await store.request_cancel(acme[3].run_id)
    await store.ack(globex[0])
    await enqueue("acme", 2)  # pending
    cancelled = await enqueue("acme", 1)
    await store.request_cancel(cancelled[0])  # pending: cancelled at once

    async def actual(tenant: str | None) -> dict[str, int]:
        async with store.connection() as conn:
            cur = await conn.execute(
                "SELECT status, count(*) AS n FROM agent_runs"
                " WHERE %(t)s::text IS NULL OR tenant_id = %(t)s::text GROUP BY status",
                {"t": tenant})
            return {r["status"]: int(r["n"]) for r in await cur.fetchall()}

    expected_acme = {"done": 2, "dead": 1, "leased": 3, "pending": 2, "cancelled": 1}
    assert await actual("acme") == expected_acme
    for fold in (False, True):  # from the deltas alone, then from the folded totals
        if fold:
            assert await store.fold_counts() > 0
        assert (await store.status_counts(tenant_id="acme")).by_status == expected_acme
        assert (await store.status_counts(tenant_id="globex")).by_status == await actual(
            "globex")
        assert (await store.status_counts()).by_status == await actual(None)
    assert (await store.status_counts(pool="elsewhere")).by_status == {}

    async with signed_in(ui, "acme") as tenant:
        page = await tenant.get("/ui/runs", params={"tenant": "globex"})  # ignored
        shown = counts_shown(page.text)
        assert {k: v for k, v in shown.items() if v} == expected_acme
        assert "All 9 runs of tenant acme in every pool" in page.text
        labelled = await tenant.get("/ui/runs", params={"label": "team:x"})
        assert "the counts ignore the other filters" in labelled.text
    async with signed_in(ui, "admin") as admin:
        page = await admin.get("/ui/runs", params={"tenant": "globex"})
        assert {k: v for k, v in counts_shown(page.text).items() if v} == await actual(
            "globex")
        everyone = counts_shown((await admin.get("/ui/runs")).text)
        assert {k: v for k, v in everyone.items() if v} == await actual(None)
