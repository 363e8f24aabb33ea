"""Schedules (issue 15): due ticks enqueue exactly one run each, across
leaders and handovers; catch-up, overlap, pause; the HTTP API and the SDK."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from runlease.client import AsyncClient, Client, Conflict, NotFound
from runlease.clock import ManualClock
from runlease.core.cron import Cron
from runlease.db import schedules as schedules_module
from runlease.db.schedules import tick_key
from runlease.db.store import RunStore
from runlease.errors import NotAllowed, ValidationError
from runlease.services.leader import LeaderElector
from runlease.services.scheduler import Scheduler
from tests.support.api import Api
from tests.support.waiting import until
from tests.support.workers import running_worker

START = datetime(2026, 12, 1, 10, 2, 0, tzinfo=UTC)
EVERY_5 = Cron.checked("*/5 * * * *")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


def at(clock: ManualClock, moment: datetime) -> None:
    clock.advance((moment - clock.db_now()).total_seconds())


async def scheduled_runs(store: RunStore) -> list[tuple[str | None, str]]:
    runs = await store.list_runs(limit=500)
    return sorted((r.idempotency_key, r.status) for r in runs)


async def test_a_due_tick_enqueues_one_run_and_moves_on(store: RunStore,
                                                        clock: ManualClock) -> None:
    schedule = await store.create_schedule("acme", "five", EVERY_5,
                                           {"input": {"n": 1}, "priority": 3})
    assert schedule.next_tick_at == START.replace(minute=5)
    at(clock, START.replace(minute=4, second=59))
    assert await store.fire_due_schedules() == []
    at(clock, START.replace(minute=5, second=0, microsecond=400_000))
    (tick,) = await store.fire_due_schedules()
    assert (tick.tick, tick.missed, tick.error) == (START.replace(minute=5), 0, None)
    assert await store.fire_due_schedules() == []  # the same instant again: nothing
    run = await store.get(tick.run_id)  # type: ignore[arg-type]
    assert (run.tenant_id, run.input_json, run.priority) == ("acme", {"n": 1}, 3)
    assert run.idempotency_key == tick_key(schedule.id, START.replace(minute=5))
    after = await store.get_schedule(schedule.id)
    assert (after.next_tick_at, after.last_tick_at, after.last_run_id) == (
        START.replace(minute=10), START.replace(minute=5), run.id)


async def test_two_schedulers_that_both_lead_enqueue_each_tick_once(
    store: RunStore, clock: ManualClock
) -> None:
    for i in range(5):
        await store.create_schedule("acme", f"s{i}", EVERY_5, {"input": {"i": i}},
                                    overlap="allow")
    for minute in (5, 10, 15):
        at(clock, START.replace(minute=minute))
        # Two processes that both believe they lead, at the same moment.
        handled = await asyncio.gather(store.fire_due_schedules(batch=3),
                                       store.fire_due_schedules(batch=3),
                                       store.fire_due_schedules(batch=3))
        again = await store.fire_due_schedules()
        assert sum(len(h) for h in handled) + len(again) == 5
    runs = await scheduled_runs(store)
    assert len(runs) == 15
    assert len({key for key, _ in runs}) == 15  # one per schedule and tick


async def test_a_leader_handover_across_ticks_neither_doubles_nor_skips(
    store: RunStore, clock: ManualClock
) -> None:
    schedule = await store.create_schedule("acme", "handover", EVERY_5, {"input": {}},
                                           overlap="allow")
    first = LeaderElector(store, "a", role="reaper", ttl_s=3600, clock=clock)
    second = LeaderElector(store, "b", role="reaper", ttl_s=3600, clock=clock)
    a, b = Scheduler(store, first), Scheduler(store, second)
    await first.run_once()
    await second.run_once()
    assert (first.is_leader, second.is_leader) == (True, False)
    at(clock, START.replace(minute=5))
    await asyncio.gather(a.run_once(), b.run_once())
    # a hands over (a clean shutdown resigns); b takes the role and the next tick.
    await first.resign()
    await second.run_once()
    assert second.is_leader
    at(clock, START.replace(minute=10))
    await asyncio.gather(a.run_once(), b.run_once())
    await b.run_once()
    keys = [key for key, _ in await scheduled_runs(store)]
    assert keys == [tick_key(schedule.id, START.replace(minute=m)) for m in (5, 10)]


async def test_missed_ticks_catch_up_with_only_the_latest(store: RunStore,
                                                          clock: ManualClock) -> None:
    schedule = await store.create_schedule("acme", "missed", EVERY_5, {"input": {}})
    # No leader from 10:02 to 10:31: ticks 10:05 ... 10:30 are due.
    at(clock, START.replace(minute=31))
    (tick,) = await store.fire_due_schedules()
    assert (tick.tick, tick.missed) == (START.replace(minute=30), 5)
    keys = [key for key, _ in await scheduled_runs(store)]
    assert keys == [tick_key(schedule.id, START.replace(minute=30))]
    assert (await store.get_schedule(schedule.id)).next_tick_at == START.replace(minute=35)


async def test_overlap_skip_waits_for_the_previous_run_and_allow_does_not(
    store: RunStore, clock: ManualClock
) -> None:
    skip = await store.create_schedule("acme", "skip", EVERY_5, {"input": {}})
    allow = await store.create_schedule("acme", "allow", EVERY_5, {"input": {}},
                                        overlap="allow")
    at(clock, START.replace(minute=5))
    first = {t.schedule_id: t for t in await store.fire_due_schedules()}
    at(clock, START.replace(minute=10))
    second = {t.schedule_id: t for t in await store.fire_due_schedules()}
    assert second[allow.id].run_id is not None
    assert second[skip.id].run_id is None
    assert "is pending" in (second[skip.id].error or "")
    assert "is pending" in ((await store.get_schedule(skip.id)).last_error or "")
    await store.request_cancel(first[skip.id].run_id)  # type: ignore[arg-type]
    at(clock, START.replace(minute=15))
    third = {t.schedule_id: t for t in await store.fire_due_schedules()}
    assert third[skip.id].run_id is not None
    assert (await store.get_schedule(skip.id)).last_error is None


async def test_paused_schedules_enqueue_nothing_and_resume_after_now(
    store: RunStore, clock: ManualClock
) -> None:
    schedule = await store.create_schedule("acme", "p", EVERY_5, {"input": {}}, paused=True)
    at(clock, START.replace(minute=21))
    assert await store.fire_due_schedules() == []
    resumed = await store.set_schedule_paused(schedule.id, False)
    assert resumed.next_tick_at == START.replace(minute=25)
    assert await store.fire_due_schedules() == []


async def test_schedules_per_tenant_are_bounded(store: RunStore,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedules_module, "SCHEDULES_PER_TENANT_MAX", 2)
    for name in ("a", "b"):
        await store.create_schedule("acme", name, EVERY_5, {"input": {}})
    with pytest.raises(ValidationError) as caught:
        await store.create_schedule("acme", "c", EVERY_5, {"input": {}})
    assert "2 schedules" in caught.value.message
    await store.create_schedule("globex", "a", EVERY_5, {"input": {}})  # per tenant


async def test_a_template_the_pool_refuses_later_is_a_skipped_tick(
    store: RunStore, clock: ManualClock
) -> None:
    schedule = await store.create_schedule("acme", "band", EVERY_5,
                                           {"input": {}, "priority": 9})
    await store.set_tenant_priority_band("default", "acme", -5, 5)
    at(clock, START.replace(minute=5))
    (tick,) = await store.fire_due_schedules()
    assert tick.run_id is None
    assert "priority" in (tick.error or "")
    assert (await store.get_schedule(schedule.id)).next_tick_at == START.replace(minute=10)


def test_cron_checks_and_dst() -> None:
    for expr, tz, field in [("* * * *", "UTC", "cron"), ("61 * * * *", "UTC", "cron"),
                            ("* * * * * *", "UTC", "cron"), ("0 0 30 2 *", "UTC", "cron"),
                            ("* * * * *", "Mars/Olympus", "timezone"),
                            ("* * * * *", "../../etc/passwd", "timezone")]:
        with pytest.raises(ValidationError) as caught:
            Cron.checked(expr, tz)
        assert caught.value.field == field, (expr, tz)
    berlin = Cron.checked("30 2 * * *", "Europe/Berlin")
    # 2026-03-29 02:30 does not exist in Berlin (clocks jump 02:00 -> 03:00).
    before = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)
    ticks = [berlin.next_after(before)]
    ticks.append(berlin.next_after(ticks[0]))
    ticks.append(berlin.next_after(ticks[1]))
    assert [t.isoformat() for t in ticks] == ["2026-03-29T01:00:00+00:00",
                                              "2026-03-30T00:30:00+00:00",
                                              "2026-03-31T00:30:00+00:00"]
    assert berlin.latest_at_or_before(ticks[1]) == ticks[1]
    assert berlin.latest_at_or_before(ticks[1] - timedelta(seconds=1)) == ticks[0]


async def test_schedules_through_the_api_are_tenant_scoped(api: Api) -> None:
    async with AsyncClient(api.url, api.token("acme")) as acme, \
            AsyncClient(api.url, api.token("globex")) as globex:
        made = await acme.create_schedule("nightly", "30 2 * * *",
                                          {"input": {"suite": "eval"}, "priority": 2},
                                          timezone="Europe/Berlin")
        assert (made.tenant_id, made.paused, made.overlap) == ("acme", False, "skip")
        assert made.template == {"input": {"suite": "eval"}, "pool": "default",
                                 "priority": 2}
        with pytest.raises(NotFound):
            await globex.schedule(made.id)
        with pytest.raises(NotFound):
            await globex.pause_schedule(made.id)
        with pytest.raises(NotFound):
            await globex.delete_schedule(made.id)
        assert (await globex.schedules()).items == []
        with pytest.raises(Conflict):
            await acme.create_schedule("nightly", "0 * * * *", {"input": {}})
        paused = await acme.pause_schedule(made.id)
        assert paused.paused
        resumed = await acme.resume_schedule(made.id)
        assert not resumed.paused
        page = await acme.schedules()
        assert [s.name for s in page.items] == ["nightly"]
        await acme.delete_schedule(made.id)
        with pytest.raises(NotFound):
            await acme.schedule(made.id)
    async with httpx.AsyncClient(base_url=api.url) as http:
        bad = [({"name": "x", "cron": "61 * * * *", "template": {"input": {}}}, "acme", 422),
               ({"name": "x", "cron": "* * * * *", "timezone": "Nope/Zone",
                 "template": {"input": {}}}, "acme", 422),
               ({"name": "Bad Name", "cron": "* * * * *", "template": {"input": {}}}, "acme",
                422),
               ({"name": "x", "cron": "* * * * *", "template": {"input": {}, "pool": "nope"}},
                "acme", 404),
               ({"name": "x", "cron": "* * * * *", "template": {}}, "acme", 422),
               ({"name": "x", "cron": "* * * * *", "template": {"input": {}}}, "admin", 403),
               ({"name": "x", "cron": "* * * * *", "template": {"input": {}},
                 "tenant_id": "globex"}, "acme", 403)]
        for body, who, status in bad:
            response = await http.post("/v1/schedules", json=body, headers=api.headers(who))
            assert response.status_code == status, (body, response.text)


async def test_the_sync_client_and_admin(api: Api) -> None:
    def run() -> None:
        with Client(api.url, api.token("admin")) as admin:
            made = admin.create_schedule("hourly", "0 * * * *", {"input": {}},
                                         tenant_id="globex", overlap="allow", paused=True)
            assert (made.tenant_id, made.paused, made.overlap) == ("globex", True, "allow")
            assert [s.name for s in admin.schedules().items] == ["hourly"]
            assert not admin.resume_schedule(made.id).paused
            admin.delete_schedule(made.id)

    await asyncio.to_thread(run)


async def test_a_worker_hosts_the_scheduler_and_runs_the_tick(db_url: str,
                                                              live_store: RunStore) -> None:
    schedule = await live_store.create_schedule("acme", "soon", Cron.checked("0 0 * * *"),
                                                {"input": {"steps": []}})
    # Due now instead of at midnight: what a tick reached while no one ran looks like.
    async with live_store.connection() as conn:
        await conn.execute("UPDATE agent_run_schedules SET next_tick_at = now() - "
                           "interval '1 second' WHERE id = %s", (schedule.id,))
    async with running_worker(db_url):
        async def ticked() -> object:
            s = await live_store.get_schedule(schedule.id)
            return s.last_run_id

        run_id = await until(ticked, what="the worker's scheduler to enqueue the tick")
        run = await until(lambda: _finished(live_store, run_id), what="the tick's run")
    assert (run.status, run.tenant_id) == ("done", "acme")


async def _finished(store: RunStore, run_id: object) -> object:
    run = await store.get(run_id)  # type: ignore[arg-type]
    return run if run.finished_at is not None else None


async def test_a_schedule_may_name_a_webhook_checked_at_creation_and_each_tick(
    store: RunStore, clock: ManualClock
) -> None:
    with pytest.raises(NotAllowed):  # a 403 through the API
        await store.create_schedule("acme", "hooked", EVERY_5, {
            "input": {}, "webhook_url": "http://hooks.example.com/done"})
    await store.set_webhook_hosts([("hooks.example.com", False)])
    schedule = await store.create_schedule("acme", "hooked", EVERY_5, {
        "input": {}, "webhook_url": "http://hooks.example.com/done"}, overlap="allow")
    at(clock, START.replace(minute=5))
    (tick,) = await store.fire_due_schedules()
    assert tick.run_id is not None
    delivery = await store.webhook(tick.run_id, tenant_id="acme")
    assert delivery is not None
    assert (delivery["url"], delivery["state"]) == ("http://hooks.example.com/done", "waiting")
    # The admin takes the host off the allowlist: the next tick is refused, said so.
    await store.set_webhook_hosts([])
    at(clock, START.replace(minute=10))
    (refused,) = await store.fire_due_schedules()
    assert refused.run_id is None
    assert "allowlist" in (refused.error or "")
    assert (await store.get_schedule(schedule.id)).next_tick_at == START.replace(minute=15)
