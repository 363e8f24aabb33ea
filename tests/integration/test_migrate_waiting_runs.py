"""The upgrade from schema 0018 (the first with runs waiting for a person,
issue 28) to the head keeps waiting runs, their requests and inboxes, and
the live leases of a running worker (issue 26: a migration test of pending,
leased and waiting runs with live workers; test_migrate_lease_per_worker.py
covers the upgrade that moved the lease, from 0014).

The database is built as the runlease of 6e7b576 (the last commit of main
whose newest migration was 0018) left it: migrations 0001..0018 and its
functions.sql, every row written by its own statements, verbatim
(tests/fixtures/schema_0018/: functions.sql, parts.sql, runs.sql,
workers.sql and humans.sql of 6e7b576). Then the real `migrate` takes it to
the head, and the current store carries on with the same worker
incarnation, its clock moved by hand.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest

from runlease.clock import ManualClock
from runlease.db.channels import INBOX_CHANNEL, POOL_CHANNEL_PREFIX
from runlease.db.humans import InputRefused
from runlease.db.migrate import migrate, migrations
from runlease.db.models import Lease
from runlease.db.store import Registration, RunStore
from runlease.errors import ValidationError
from tests.integration.test_schema import schema_dump
from tests.support.old_schema import (
    FIXTURES,
    OldStatements,
    counts_consistent,
    migrate_to,
    snapshot,
    store_at,
)

OLD = FIXTURES / "schema_0018"
# 0019 and every migration after it: what an upgrade from 0018 applies.
SINCE_0019 = list(range(19, len(migrations()) + 1))
LEASE_S = 600
WORKER = "old-w"
UNSET = UUID(int=0)  # a Fleet's run not written yet


class OldCode(OldStatements):
    """The runlease of schema 0018, through its own statements."""

    folder = OLD

    def register(self, now: datetime, worker: str) -> None:
        rows = self.run("worker_register", now, worker=worker, pool="default", version="0.18",
                        concurrency=10, lease_s=LEASE_S)
        assert len(rows) == 1

    def beat(self, now: datetime, worker: str, runs_held: int) -> None:
        (row,) = self.run("worker_heartbeat", now, worker=worker, lease_s=LEASE_S,
                          runs_held=runs_held, stale_writes=0)
        assert row["expires_at"] is not None

    def claim(self, now: datetime, worker: str, ids: list[UUID]) -> dict[UUID, int]:
        """Claims exactly `ids` (all that is claimable then): {id: epoch}."""
        rows = self.run("run_claim", now, pool="default", worker=worker, n=len(ids) + 5)
        assert {r["id"] for r in rows} == set(ids)
        return {r["id"]: r["lease_epoch"] for r in rows}

    def wait_input(self, now: datetime, worker: str, run_id: UUID, epoch: int, name: str, *,
                   prompt: str | None, schema: Any, timeout_s: float | None) -> None:
        (row,) = self.run("run_wait_input", now, worker=worker, id=run_id, epoch=epoch,
                          name=name, prompt=prompt,
                          schema=None if schema is None else json.dumps(schema),
                          timeout_s=timeout_s, nonce=uuid4().hex,
                          channel_prefix=POOL_CHANNEL_PREFIX)
        assert (row["status"], row["asked"]) == ("waiting", 1)

    def message(self, now: datetime, run_id: UUID, text: str) -> int:
        (row,) = self.run("run_message_add", now, id=run_id, tenant=None,
                          body=json.dumps({"text": text}), max_unread=100, max_total=10_000,
                          channel=INBOX_CHANNEL)
        return int(row["seq"])

    def ack(self, now: datetime, worker: str, held: dict[UUID, int]) -> None:
        rows = self.run("run_ack", now, worker=worker, ids=list(held), epochs=list(held.values()),
                        results=None, channel_prefix=POOL_CHANNEL_PREFIX)
        assert len(rows) == len(held)


@dataclass
class Fleet:
    """What the old runlease left, by role."""

    now: datetime
    approval: UUID = UNSET  # waiting for a yes/no, an hour to answer
    question: UUID = UNSET  # waiting for free text, a minute to answer
    held: UUID = UNSET  # leased by the live worker, a message in its inbox
    done: UUID = UNSET
    pending: list[UUID] = field(default_factory=list)
    epochs: dict[UUID, int] = field(default_factory=dict)


def populate(old: OldCode) -> Fleet:
    now = datetime.now(UTC)
    fleet = Fleet(now)
    old.register(now, WORKER)
    fleet.approval, fleet.question, fleet.held, fleet.done = runs = old.enqueue(now, 4)
    fleet.epochs = old.claim(now, WORKER, runs)
    old.wait_input(now, WORKER, fleet.approval, fleet.epochs[fleet.approval], "approve",
                   prompt="Ship it?", schema={"type": "boolean"}, timeout_s=3600)
    old.wait_input(now, WORKER, fleet.question, fleet.epochs[fleet.question], "ask",
                   prompt="Which branch?", schema=None, timeout_s=60)
    assert old.message(now, fleet.held, "hello before the upgrade") == 1
    old.ack(now, WORKER, {fleet.done: fleet.epochs[fleet.done]})
    old.beat(now, WORKER, runs_held=1)
    fleet.pending = old.enqueue(now, 2, tenant="globex")
    return fleet


@dataclass
class Upgraded:
    url: str
    fleet: Fleet
    before: dict[UUID, tuple[Any, ...]]


@pytest.fixture
def upgraded(empty_db_url: str) -> Iterator[Upgraded]:
    """A database the runlease of schema 0018 was using, migrated to the head."""
    migrate_to(empty_db_url, OLD, 18, "humans_in_the_loop")
    old = OldCode(empty_db_url)
    try:
        fleet = populate(old)
        counts_consistent(empty_db_url)
        before = snapshot(empty_db_url)
        assert [m.version for m in migrate(empty_db_url)] == SINCE_0019
        yield Upgraded(empty_db_url, fleet, before)
    finally:
        old.conn.close()


@pytest.fixture
async def new_store(upgraded: Upgraded) -> AsyncIterator[tuple[RunStore, ManualClock]]:
    """The current store, its clock at the instant of the old writes."""
    async with store_at(upgraded.url, upgraded.fleet.now) as store_and_clock:
        yield store_and_clock


def test_the_upgrade_changes_no_run(upgraded: Upgraded, db_url: str) -> None:
    url, fleet = upgraded.url, upgraded.fleet
    # The schema of a fresh database: nothing of the old functions.sql outlives it.
    assert schema_dump(url) == schema_dump(db_url)
    assert snapshot(url) == upgraded.before
    statuses = {run_id: s[0] for run_id, s in upgraded.before.items()}
    assert statuses == {fleet.approval: "waiting", fleet.question: "waiting",
                        fleet.held: "leased", fleet.done: "done",
                        **dict.fromkeys(fleet.pending, "pending")}
    # A wait charged no attempt.
    assert upgraded.before[fleet.approval][1] == 0
    counts_consistent(url)
    assert migrate(url) == []


async def test_waiting_runs_and_a_live_worker_carry_on_under_the_new_code(
    upgraded: Upgraded, new_store: tuple[RunStore, ManualClock]
) -> None:
    store, clock = new_store
    url, fleet = upgraded.url, upgraded.fleet
    worker = Registration(WORKER, "default", 10)

    # The worker that was running keeps its incarnation: the new code's
    # heartbeat renews it, and its lease on `held` holds through the upgrade.
    clock.advance(5)
    assert await store.heartbeat(worker, lease_s=LEASE_S, runs_held=1) is not None
    held = Lease(await store.get(fleet.held), WORKER)
    assert held.epoch == fleet.epochs[fleet.held]
    # The message sent before the upgrade is taken once, as its step.
    message = await store.take_message(held, 1)
    assert message is not None
    assert (message["seq"], message["text"]) == (1, "hello before the upgrade")
    assert await store.take_message(held, 2) is None
    assert (await store.get_steps(fleet.held))["message:1"].result == message
    await store.ack(held)

    # The requests asked before the upgrade are still open, as they were asked.
    (approve,) = await store.input_requests(fleet.approval)
    assert (approve.name, approve.prompt, approve.schema, approve.answered_at) == (
        "approve", "Ship it?", {"type": "boolean"}, None)
    # Answered through the new code once, checked against the old request's schema.
    with pytest.raises(ValidationError):
        await store.give_input(fleet.approval, "approve", "yes")
    assert await store.give_input(fleet.approval, "approve", True) is True
    assert await store.give_input(fleet.approval, "approve", True) is False
    with pytest.raises(InputRefused):
        await store.give_input(fleet.approval, "approve", False)
    # The other times out by the reaper's pass of the new code, once.
    assert await store.time_out_inputs() == []
    clock.advance(61)
    assert await store.time_out_inputs() == [(fleet.question, "default", "acme", "ask")]
    assert await store.time_out_inputs() == []

    # A worker of the new code runs the rest: the resumed runs start their
    # first charged attempt after the waits, each finds its answer as the
    # step the wait left.
    await store.register_worker(Registration("new-1", "default", 50), lease_s=60)
    claimed = {x.run_id: x for x in await store.claim("default", "new-1", 50)}
    assert set(claimed) == {fleet.approval, fleet.question, *fleet.pending}
    assert claimed[fleet.approval].run.attempts == 1
    assert claimed[fleet.approval].epoch == fleet.epochs[fleet.approval] + 1
    assert (await store.get_steps(fleet.approval))["input:approve"].result == {"value": True}
    assert (await store.get_steps(fleet.question))["input:ask"].result == {"timed_out": True}
    for lease in claimed.values():
        await store.ack(lease)

    final = snapshot(url)
    assert set(final) == set(upgraded.before)
    assert {s[0] for s in final.values()} == {"done"}
    counts_consistent(url)
    await store.fold_counts()
    counts_consistent(url)
