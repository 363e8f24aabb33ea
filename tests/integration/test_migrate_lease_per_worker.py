"""Migration 0015 (a lease per worker incarnation, issue 26) upgrades a
database that the runlease of schema 0014 was using: pending, delayed,
leased (live and lapsed, of workers with and without a live registry row),
cancel-requested, waiting (a parent parked for its child) and finished
runs, and loses none.

The database is built as that runlease left it: migrations 0001..0014 and
its functions.sql, then every row written by its own statements, verbatim
(tests/fixtures/schema_0014/: functions.sql, parts.sql, runs.sql,
children.sql and workers.sql of e0156f2, the last commit before core v2). Then the real
`migrate` takes it to the head, and the new code's store takes over, its
clock moved by hand (ManualClock) past each carried lease's expiry.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest

from runlease.clock import ManualClock
from runlease.db.channels import CANCEL_CHANNEL, POOL_CHANNEL_PREFIX
from runlease.db.connect import make_conn_pool
from runlease.db.migrate import migrate, migrations
from runlease.db.models import Lease
from runlease.db.store import Registration, RunStore
from runlease.errors import IncarnationEnded, LeaseLost, RunleaseError
from tests.integration.test_schema import schema_dump
from tests.support.old_schema import (
    FIXTURES,
    OldStatements,
    counts_consistent,
    migrate_to,
    snapshot,
    store_at,
)
from tests.support.waiting import until_sync

OLD = FIXTURES / "schema_0014"
CARRIED, LAPSED = ":0015", ":0015-lapsed"
UNSET = UUID(int=0)  # a Fleet's run not written yet

# 0015 and every migration after it: what an upgrade from 0014 applies.
SINCE_0015 = list(range(15, len(migrations()) + 1))


def migrate_to_0014(url: str) -> None:
    """Migrations 0001..0014 and the functions.sql of their time, applied
    and recorded as the runlease of e0156f2 did."""
    migrate_to(url, OLD, 14, "finished_runs_by_tenant")


class OldCode(OldStatements):
    """The runlease of schema 0014, through its own statements."""

    folder = OLD

    def claim(self, now: datetime, worker: str, ids: list[UUID], lease_s: int) -> dict[UUID, int]:
        """Claims exactly `ids` (all that is claimable then): {id: epoch}."""
        rows = self.run(
            "run_claim", now, pool="default", worker=worker, n=len(ids) + 5, lease_s=lease_s
        )
        assert {r["id"] for r in rows} == set(ids)
        return {r["id"]: r["lease_epoch"] for r in rows}

    def heartbeat(
        self, now: datetime | None, worker: str, held: dict[UUID, int], lease_s: int
    ) -> dict[str, Any]:
        (row,) = self.run(
            "run_heartbeat",
            now,
            worker=worker,
            ids=list(held),
            epochs=list(held.values()),
            lease_s=lease_s,
            pool="default",
            version="0.14",
            concurrency=10,
            stale_writes=0,
        )
        return row

    def beat(self, now: datetime | None, worker: str, lease_s: int) -> None:
        """The old heartbeat of a worker holding no run: its registry row."""
        self.run(
            "worker_beat",
            now,
            worker=worker,
            pool="default",
            version="0.14",
            concurrency=10,
            lease_s=lease_s,
            stale_writes=0,
        )

    def ack(self, now: datetime | None, worker: str, held: dict[UUID, int]) -> int:
        return len(
            self.run(
                "run_ack",
                now,
                worker=worker,
                ids=list(held),
                epochs=list(held.values()),
                results=None,
                channel_prefix=POOL_CHANNEL_PREFIX,
            )
        )

    def fail(self, now: datetime, worker: str, run_id: UUID, epoch: int) -> None:
        rows = self.run(
            "run_fail",
            now,
            worker=worker,
            id=run_id,
            epoch=epoch,
            error_code="broken",
            error_message="x",
            channel_prefix=POOL_CHANNEL_PREFIX,
        )
        assert len(rows) == 1

    def wait_children(
        self, now: datetime, worker: str, parent: UUID, epoch: int, child: UUID
    ) -> None:
        """`child` is `parent`'s, and `parent`, leased by `worker`, waits for it."""
        self.run("run_parent_set", now, id=child, parent=parent)
        (row,) = self.run(
            "run_wait_children",
            now,
            worker=worker,
            id=parent,
            epoch=epoch,
            channel_prefix=POOL_CHANNEL_PREFIX,
        )
        assert (row["status"], row["awaiting_children"]) == ("pending", True)

    def request_cancel(self, now: datetime, run_id: UUID) -> None:
        rows = self.run("run_request_cancel", now, id=run_id, tenant=None, channel=CANCEL_CHANNEL)
        assert len(rows) == 1


@dataclass
class Fleet:
    """What the old runlease left in the database, by role."""

    now: datetime  # the instant of the "present" writes; the migration runs just after
    lapsed: list[UUID] = field(default_factory=list)  # old-c's, lease over an hour ago
    lapsed_last: UUID = UNSET  # lapsed on its last attempt: dead at the reap
    lapsed_cancel: UUID = UNSET  # old-d's, lapsed, cancel requested
    live_a: list[UUID] = field(default_factory=list)  # old-a's, which still beats its row
    live_a_cancel: UUID = UNSET  # old-a's, cancel requested
    live_b: UUID = UNSET  # old-b's: no registry row, a shorter lease
    parent: UUID = UNSET  # waiting (pending, parked) for its child ...
    child: UUID = UNSET  # ... leased by old-b
    live_c: UUID = UNSET  # old-c's too: a holder with lapsed and live leases
    pending: list[UUID] = field(default_factory=list)
    delayed: UUID = UNSET
    epochs: dict[UUID, int] = field(default_factory=dict)


A_LEASE_S, B_LEASE_S = 600, 300


def populate(old: OldCode) -> Fleet:
    now = datetime.now(UTC)
    then = now - timedelta(hours=1)
    fleet = Fleet(now)
    # An hour ago: leases of 60 s, long lapsed, never reaped (no reaper ran).
    fleet.lapsed = old.enqueue(then - timedelta(seconds=10), 2)
    fleet.epochs |= old.claim(then, "old-c", fleet.lapsed, 60)
    (fleet.lapsed_last,) = old.enqueue(then - timedelta(seconds=9), 1, max_attempts=1)
    fleet.epochs |= old.claim(then, "old-c", [fleet.lapsed_last], 60)
    (fleet.lapsed_cancel,) = old.enqueue(then - timedelta(seconds=8), 1)
    fleet.epochs |= old.claim(then, "old-d", [fleet.lapsed_cancel], 60)
    old.request_cancel(then + timedelta(seconds=1), fleet.lapsed_cancel)
    # Finished runs: done, dead, cancelled while pending.
    done = old.enqueue(then, 2)
    held = old.claim(then + timedelta(seconds=1), "old-e", done, 60)
    assert old.ack(then + timedelta(seconds=2), "old-e", dict(list(held.items())[:1])) == 1
    dead = done[1]
    old.fail(then + timedelta(seconds=2), "old-e", dead, held[dead])
    (cancelled,) = old.enqueue(then, 1)
    old.request_cancel(then + timedelta(seconds=1), cancelled)
    # Now: live leases of three holders.
    fleet.live_a = old.enqueue(now, 2)
    fleet.epochs |= old.claim(now, "old-a", fleet.live_a, A_LEASE_S)
    (fleet.live_a_cancel,) = old.enqueue(now, 1, tenant="globex")
    fleet.epochs |= old.claim(now, "old-a", [fleet.live_a_cancel], A_LEASE_S)
    old.request_cancel(now, fleet.live_a_cancel)
    # A parent waiting for its child (pending, parked: no lease, no slot).
    (fleet.parent,) = old.enqueue(now, 1)
    parent_epoch = old.claim(now, "old-a", [fleet.parent], A_LEASE_S)[fleet.parent]
    (fleet.child,) = old.enqueue(now, 1)
    old.wait_children(now, "old-a", fleet.parent, parent_epoch, fleet.child)
    (fleet.live_b,) = old.enqueue(now, 1, tenant="globex")
    fleet.epochs |= old.claim(now, "old-b", [fleet.live_b, fleet.child], B_LEASE_S)
    (fleet.live_c,) = old.enqueue(now, 1)
    fleet.epochs |= old.claim(now, "old-c", [fleet.live_c], A_LEASE_S)
    # old-a's lease keeper beats: its runs and its registry row, live.
    a_held = {r: fleet.epochs[r] for r in [*fleet.live_a, fleet.live_a_cancel]}
    row = old.heartbeat(now, "old-a", a_held, A_LEASE_S)
    assert row["renewed"] == 3
    assert row["cancel_requested"] == [fleet.live_a_cancel]
    old.beat(now, "old-idle", A_LEASE_S)  # a worker holding nothing
    # Runs still waiting: ready, and for later.
    fleet.pending = old.enqueue(now, 3, tenant="globex")
    (fleet.delayed,) = old.enqueue(now, 1, delay_s=3600)
    return fleet


def incarnations(url: str) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT id, pool, runs_held, expires_at, ended_at IS NOT NULL FROM agent_run_workers"
        ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def holders(url: str) -> dict[UUID, str | None]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, locked_by FROM agent_runs").fetchall()
    return {r[0]: r[1] for r in rows}


@dataclass
class Upgraded:
    url: str
    fleet: Fleet
    before: dict[UUID, tuple[Any, ...]]
    old: OldCode


@pytest.fixture
def upgraded(empty_db_url: str) -> Iterator[Upgraded]:
    """A database the old runlease was using, migrated to the head."""
    migrate_to_0014(empty_db_url)
    old = OldCode(empty_db_url)
    try:
        fleet = populate(old)
        counts_consistent(empty_db_url)
        before = snapshot(empty_db_url)
        assert [m.version for m in migrate(empty_db_url)] == SINCE_0015
        yield Upgraded(empty_db_url, fleet, before, old)
    finally:
        old.conn.close()


@pytest.fixture
async def new_store(upgraded: Upgraded) -> AsyncIterator[tuple[RunStore, ManualClock]]:
    """The new code's store, its clock at the instant of the old writes
    (the migration ran just after them)."""
    async with store_at(upgraded.url, upgraded.fleet.now) as store_and_clock:
        yield store_and_clock


def test_no_run_is_lost_and_each_lease_is_carried_to_an_incarnation(
    upgraded: Upgraded, db_url: str
) -> None:
    fleet, url = upgraded.fleet, upgraded.url
    # The schema of a fresh database: nothing of the old functions.sql
    # (an old signature, a trigger) outlives the upgrade.
    assert schema_dump(url) == schema_dump(db_url)
    # Every run, in the same status, attempt and epoch.
    assert snapshot(url) == upgraded.before
    counts_consistent(url)
    # Each holder's live leases under '<holder>:0015', its lapsed ones
    # under '<holder>:0015-lapsed'; nothing else holds a name.
    expected_holders: dict[UUID, str | None] = dict.fromkeys(upgraded.before)
    for run_id in [*fleet.lapsed, fleet.lapsed_last]:
        expected_holders[run_id] = "old-c" + LAPSED
    expected_holders[fleet.lapsed_cancel] = "old-d" + LAPSED
    for run_id in [*fleet.live_a, fleet.live_a_cancel]:
        expected_holders[run_id] = "old-a" + CARRIED
    expected_holders[fleet.live_b] = expected_holders[fleet.child] = "old-b" + CARRIED
    expected_holders[fleet.live_c] = "old-c" + CARRIED
    assert holders(url) == expected_holders
    # One incarnation per carried holder, living as long as its leases
    # would have; the lapsed ones already expired. The old rows stay as
    # they were (they hold nothing now).
    lapsed_at = fleet.now - timedelta(hours=1) + timedelta(seconds=60)
    a_until = fleet.now + timedelta(seconds=A_LEASE_S)
    rows = incarnations(url)
    assert rows == {
        "old-a" + CARRIED: ("default", 3, a_until, False),
        "old-b" + CARRIED: ("default", 2, fleet.now + timedelta(seconds=B_LEASE_S), False),
        "old-c" + CARRIED: ("default", 1, a_until, False),
        "old-c" + LAPSED: ("default", 3, lapsed_at, False),
        "old-d" + LAPSED: ("default", 1, lapsed_at, False),
        "old-a": ("default", 3, a_until, False),
        "old-idle": ("default", 0, a_until, False),
    }
    # The parent still waits for its child: pending, parked, no holder.
    with psycopg.connect(url) as conn:
        parked = conn.execute(
            "SELECT status, delayed, awaiting_children, attempts FROM agent_runs WHERE id = %s",
            (fleet.parent,),
        ).fetchone()
    assert parked == ("pending", True, True, 0)
    assert migrate(url) == []


async def test_a_run_shows_its_carried_lease_expiry(
    upgraded: Upgraded, new_store: tuple[RunStore, ManualClock]
) -> None:
    store, _ = new_store
    fleet = upgraded.fleet
    run = await store.get(fleet.live_b)
    assert (run.status, run.locked_by) == ("leased", "old-b" + CARRIED)
    assert run.locked_until == fleet.now + timedelta(seconds=B_LEASE_S)
    pending = await store.get(fleet.pending[0])
    assert (pending.status, pending.locked_by, pending.locked_until) == ("pending", None, None)


async def test_carried_leases_hold_until_their_expiry_then_the_reaper_requeues_them(
    upgraded: Upgraded, new_store: tuple[RunStore, ManualClock]
) -> None:
    store, clock = new_store
    fleet, url, old = upgraded.fleet, upgraded.url, upgraded.old
    live_a = fleet.live_a

    # The first reap, a second after the migration: the lapsed leases go
    # back (or dead, on their last attempt; cancelled, if asked), their
    # incarnations end; no live lease is touched.
    clock.advance(1)
    reaped = await store.reap()
    assert sorted(reaped.ended) == ["old-c" + LAPSED, "old-d" + LAPSED]
    assert {(r[0], r[3]) for r in reaped.reaped} == {
        *((run_id, "pending") for run_id in fleet.lapsed),
        (fleet.lapsed_last, "dead"),
        (fleet.lapsed_cancel, "cancelled"),
    }
    for run_id in fleet.lapsed:
        run = await store.get(run_id)
        # The attempt was charged by the claim, not by the reap.
        assert (run.status, run.attempts, run.error_code) == ("pending", 1, "lease_expired")
    last = await store.get(fleet.lapsed_last)
    assert (last.status, last.attempts, last.error_code) == ("dead", 1, "lease_expired")
    assert (await store.get(fleet.lapsed_cancel)).status == "cancelled"
    for run_id in [*live_a, fleet.live_a_cancel, fleet.live_b, fleet.live_c]:
        assert (await store.get(run_id)).status == "leased"
    counts_consistent(url)

    # The holder by its carried id writes with the new code's fence while
    # its incarnation lives: events and an ack land.
    carried = "old-a" + CARRIED
    a0 = Lease(await store.get(live_a[0]), carried)
    a1 = Lease(await store.get(live_a[1]), carried)
    assert (a0.epoch, a1.epoch) == (fleet.epochs[live_a[0]], fleet.epochs[live_a[1]])
    await store.record_event(a1, "note", {"after": "0015"})
    await store.ack(a0, {"ok": True})
    assert (await store.get(live_a[0])).status == "done"
    # Its old name holds nothing now, its live row notwithstanding.
    with pytest.raises(LeaseLost):
        await store.record_event(Lease(await store.get(live_a[1]), "old-a"), "note", {})

    # The old worker is still running the old code: it cannot renew the
    # carried leases (its statements name the dropped column) ...
    with pytest.raises(psycopg.errors.UndefinedColumn):
        old.heartbeat(None, "old-a", {live_a[1]: fleet.epochs[live_a[1]]}, A_LEASE_S)
    # ... and its row beating by its old id (the old beat, and the new
    # code's renewal of that id) keeps no carried lease alive.
    clock.advance(B_LEASE_S - 2)  # a second before old-b's carried expiry
    old.beat(clock.db_now(), "old-a", 3 * A_LEASE_S)
    assert (
        await store.heartbeat(Registration("old-a", "default", 0), lease_s=3 * A_LEASE_S)
        is not None
    )
    reaped = await store.reap()
    assert (reaped.reaped, reaped.ended) == ((), ())
    clock.advance(2)  # a second past it
    reaped = await store.reap()
    assert reaped.ended == ("old-b" + CARRIED,)
    assert {(r[0], r[3]) for r in reaped.reaped} == {
        (fleet.live_b, "pending"),
        (fleet.child, "pending"),
    }

    clock.advance(A_LEASE_S - B_LEASE_S - 2)  # a second before old-a's and old-c's expiry
    old.beat(clock.db_now(), "old-a", 3 * A_LEASE_S)
    assert (await store.reap()).reaped == ()
    await store.record_event(a1, "note", {"still": "mine"})
    clock.advance(2)  # a second past it: the carried fence no longer writes
    with pytest.raises(LeaseLost):
        await store.record_event(a1, "note", {"late": True})
    with pytest.raises(LeaseLost):
        await store.ack(a1)
    reaped = await store.reap()
    # (old-idle's row too: it stopped beating when old-a's lease did.)
    assert sorted(reaped.ended) == ["old-a" + CARRIED, "old-c" + CARRIED, "old-idle"]
    assert {(r[0], r[3]) for r in reaped.reaped} == {
        (live_a[1], "pending"),
        (fleet.live_a_cancel, "cancelled"),
        (fleet.live_c, "pending"),
    }
    # The old row, beaten all along, was never ended.
    assert incarnations(url)["old-a"][3] is False

    # Nothing is lost: the requeued runs are claimed again by a new
    # incarnation under a new epoch, their attempts counted by the claim.
    requeued = [*fleet.lapsed, fleet.live_b, fleet.child, live_a[1], fleet.live_c]
    await store.register_worker(Registration("new-1", "default", 50), lease_s=60)
    claimed = {x.run_id: x for x in await store.claim("default", "new-1", 50)}
    assert set(claimed) == {*requeued, *fleet.pending}
    for run_id in requeued:
        before = upgraded.before[run_id]
        assert (claimed[run_id].run.attempts, claimed[run_id].epoch) == (
            before[1] + 1,
            before[2] + 1,
        )
    assert await store.wake_parents() == 0  # its child is still leased
    for x in claimed.values():
        await store.ack(x)
    # The child done, the parent that waited through the migration wakes
    # and is claimed again, its attempt not charged by the wait.
    assert await store.wake_parents() == 1
    (resumed,) = await store.claim("default", "new-1", 50)
    assert (resumed.run_id, resumed.run.attempts) == (fleet.parent, 1)
    await store.ack(resumed)
    final = snapshot(url)
    assert set(final) == set(upgraded.before)
    assert {run_id: s[0] for run_id, s in final.items() if s[0] != "done"} == {
        fleet.lapsed_last: "dead",
        fleet.lapsed_cancel: "cancelled",
        fleet.live_a_cancel: "cancelled",
        fleet.delayed: "pending",
        **{run_id: s[0] for run_id, s in upgraded.before.items() if s[0] in ("dead", "cancelled")},
    }
    counts_consistent(url)
    await store.fold_counts()
    counts_consistent(url)


async def test_no_worker_can_take_over_a_carried_incarnation(
    upgraded: Upgraded, new_store: tuple[RunStore, ManualClock]
) -> None:
    # A worker of the new code registering under a carried id, or under the
    # old id of a worker that held leases, is refused: ids are never
    # reused, so no new worker adopts leases it did not claim.
    store, _ = new_store
    for name in ["old-a" + CARRIED, "old-c" + LAPSED, "old-a", "old-b" + CARRIED]:
        with pytest.raises(RunleaseError, match="never reused"):
            await store.register_worker(Registration(name, "default", 10), lease_s=60)
    # The lapsed incarnation cannot renew (it expired before the first
    # beat), so nothing it held can be kept alive by its name either.
    assert await store.heartbeat(Registration("old-c" + LAPSED, "default", 0), lease_s=600) is None
    with pytest.raises(IncarnationEnded):
        await store.claim("default", "old-c" + LAPSED, 1)


async def test_holders_of_the_longest_ids_are_carried_within_the_id_limit(
    empty_db_url: str,
) -> None:
    # Worker ids run up to 255 characters (agent_run_workers' CHECK); the
    # carried name keeps 230 of them and its suffix. Two holders alike in
    # their first 230 characters, one live and one lapsed, stay apart.
    migrate_to_0014(empty_db_url)
    old = OldCode(empty_db_url)
    live, lapsed = "w" * 254 + "1", "w" * 254 + "2"
    now = datetime.now(UTC)
    try:
        (lapsed_run,) = old.enqueue(now - timedelta(hours=1), 1)
        old.claim(now - timedelta(hours=1), lapsed, [lapsed_run], 60)
        (live_run,) = old.enqueue(now, 1)
        old.claim(now, live, [live_run], A_LEASE_S)
        old.beat(now, live, A_LEASE_S)
        assert [m.version for m in migrate(empty_db_url)] == SINCE_0015
    finally:
        old.conn.close()
    assert holders(empty_db_url) == {
        live_run: "w" * 230 + CARRIED,
        lapsed_run: "w" * 230 + LAPSED,
    }
    clock = ManualClock(now + timedelta(seconds=1))
    async with make_conn_pool(empty_db_url, max_size=2) as conn_pool:
        store = RunStore(conn_pool, clock=clock)
        reaped = await store.reap()
        assert [(r[0], r[3]) for r in reaped.reaped] == [(lapsed_run, "pending")]
        await store.ack(Lease(await store.get(live_run), "w" * 230 + CARRIED))
    assert {s[0] for s in snapshot(empty_db_url).values()} == {"pending", "done"}


# What the old code may send while the migration runs: the statement, how
# pg_stat_activity shows it waiting, and the error it must end with (None:
# the old API's writes, which the new schema still takes).
RACERS: dict[str, tuple[str, type[psycopg.Error] | None]] = {
    "ack": ("%status = 'done'%", psycopg.errors.UndefinedColumn),
    "heartbeat": ("%SET locked_until%", psycopg.errors.UndefinedColumn),
    "claim": ("%runlease_claim%", psycopg.errors.UndefinedColumn),
    "enqueue": ("%jsonb_to_recordset%", None),
    "cancel": ("%cancel_requested_at = coalesce%", None),
}


def race(old: OldCode, what: str, held: dict[UUID, int], pending: UUID) -> None:
    if what == "ack":
        old.ack(None, "old-a", held)
    elif what == "heartbeat":
        old.heartbeat(None, "old-a", held, A_LEASE_S)
    elif what == "claim":
        old.run("run_claim", None, pool="default", worker="old-b", n=5, lease_s=60)
    elif what == "enqueue":
        old.enqueue(datetime.now(UTC), 1, tenant="late")
    else:
        old.request_cancel(datetime.now(UTC), pending)


@pytest.mark.parametrize("what", list(RACERS))
def test_an_old_write_during_the_migration_waits_for_it(empty_db_url: str, what: str) -> None:
    # The old code keeps running while the migration does. The migration
    # locks agent_runs from its first statement, so an old statement waits
    # for it whole: a worker's renewal, ack or claim then meets the new schema
    # and fails (it never lands between the leases being carried over and
    # the column being dropped, nor leases a run the migration did not
    # carry); the old API's enqueue and cancel land, counted.
    migrate_to_0014(empty_db_url)
    old = OldCode(empty_db_url)
    racer = OldCode(empty_db_url)
    blocker = psycopg.connect(empty_db_url)
    try:
        now = datetime.now(UTC)
        ids = old.enqueue(now, 2)
        held = old.claim(now, "old-a", ids, A_LEASE_S)
        (pending,) = old.enqueue(now, 1)
        # Hold the migration after its first statement: it waits for this
        # lock on agent_run_workers while it holds agent_runs.
        blocker.execute("LOCK TABLE agent_run_workers IN ACCESS SHARE MODE")
        outcome: dict[str, Any] = {}

        def run_migrate() -> None:
            outcome["applied"] = [m.version for m in migrate(empty_db_url)]

        def run_racer() -> None:
            try:
                race(racer, what, held, pending)
                outcome["landed"] = True
            except psycopg.Error as exc:
                outcome["error"] = exc

        def waiting(app: str | None, query: str) -> bool | None:
            row = old.conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND (%s::text IS NULL OR application_name = %s) AND query LIKE %s",
                (app, app, query),
            ).fetchone()
            return bool(row and row["n"]) or None

        threads = [
            threading.Thread(target=run_migrate, name="migrate"),
            threading.Thread(target=run_racer, name=f"old-{what}"),
        ]
        threads[0].start()
        until_sync(
            lambda: waiting("runlease-migrate", "%agent_run_workers%"),
            what="the migration waits on agent_run_workers",
        )
        threads[1].start()
        until_sync(
            lambda: waiting(None, RACERS[what][0]), what=f"the old {what} waits on agent_runs"
        )
        blocker.rollback()
        for thread in threads:
            thread.join(timeout=120)
        assert outcome.get("applied") == SINCE_0015
        error = RACERS[what][1]
        # The migrations after 0015 run in the same transaction and lock
        # tables the old write may have read first (agent_run_pools): then
        # PostgreSQL ends the old write as a deadlock, a clean failure its
        # client retries (on the new code); the migration goes through.
        refused = isinstance(outcome.get("error"), psycopg.errors.DeadlockDetected)
        if error is None:
            assert refused or outcome == {"applied": SINCE_0015, "landed": True}, outcome
        else:
            assert refused or isinstance(outcome.get("error"), error), outcome
        landed = outcome.get("landed", False)
        # The leases are carried, live; nothing else changed hands.
        after = snapshot(empty_db_url)
        assert {run_id: after[run_id][0] for run_id in ids} == dict.fromkeys(ids, "leased")
        assert holders(empty_db_url) == {
            **dict.fromkeys(after),
            **dict.fromkeys(ids, "old-a" + CARRIED),
        }
        assert after[pending][0] == ("cancelled" if what == "cancel" and landed else "pending")
        assert len(after) == (4 if what == "enqueue" and landed else 3)
        counts_consistent(empty_db_url)
    finally:
        blocker.close()
        old.conn.close()
        racer.conn.close()
