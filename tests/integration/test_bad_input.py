"""Bad input: a RunleaseError naming the field, and nothing written."""

from __future__ import annotations

from typing import Any

import pytest

from runlease.db.models import Pool
from runlease.db.store import NewRun, RunStore
from runlease.errors import RunleaseError, UnknownPool, ValidationError
from tests.integration.test_transitions import count_runs

BIG = "x" * (256 * 1024)

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("empty tenant", {"tenant_id": ""}, "tenant_id"),
    ("over-long tenant", {"tenant_id": "t" * 129}, "tenant_id"),
    ("tenant with a newline", {"tenant_id": "a\nb"}, "tenant_id"),
    ("empty pool", {"pool": ""}, "pool"),
    ("over-long pool", {"pool": "p" * 49}, "pool"),
    ("pool with capitals", {"pool": "Batch"}, "pool"),
    ("input is a list", {"input": [1, 2]}, "input"),
    ("input is a string", {"input": "hello"}, "input"),
    ("input over 256 KiB", {"input": {"blob": BIG}}, "input"),
    ("input with NaN", {"input": {"x": float("nan")}}, "input"),
    ("input with a NUL", {"input": {"x": "a\x00b"}}, "input"),
    ("input not JSON", {"input": {"x": object()}}, "input"),
    ("priority too high", {"priority": 101}, "priority"),
    ("priority too low", {"priority": -101}, "priority"),
    ("priority not an int", {"priority": "high"}, "priority"),
    ("priority a bool", {"priority": True}, "priority"),
    ("max_attempts zero", {"max_attempts": 0}, "max_attempts"),
    ("max_attempts too many", {"max_attempts": 101}, "max_attempts"),
    ("budget not an object", {"budget": 5}, "budget"),
    ("budget turns a string", {"budget": {"max_turns": "10"}}, "budget.max_turns"),
    ("budget deadline negative", {"budget": {"deadline_s": -1}}, "budget.deadline_s"),
    ("budget unknown field", {"budget": {"max_tokens": 5}}, "budget.max_tokens"),
    ("idempotency key empty", {"idempotency_key": ""}, "idempotency_key"),
    ("idempotency key too long", {"idempotency_key": "k" * 256}, "idempotency_key"),
]


@pytest.mark.parametrize(("change", "field"), [(c[1], c[2]) for c in CASES],
                         ids=[c[0] for c in CASES])
async def test_bad_enqueue_names_the_field_and_writes_nothing(
    store: RunStore, change: dict[str, Any], field: str
) -> None:
    args: dict[str, Any] = {"pool": "default", "tenant_id": "acme", "input": {"ok": True}}
    args |= change
    pool = args.pop("pool")
    with pytest.raises(ValidationError) as err:
        await store.enqueue(pool, **args)
    assert err.value.field == field
    assert field in str(err.value)
    assert await count_runs(store) == 0


async def test_a_bad_item_in_a_batch_writes_none_of_it(store: RunStore) -> None:
    runs = [NewRun("acme", {"i": 1}), NewRun("acme", {"i": 2}, priority=500)]
    with pytest.raises(ValidationError) as err:
        await store.enqueue_many("default", runs)
    assert err.value.field == "runs[1].priority"
    assert await count_runs(store) == 0


async def test_a_repeated_key_in_a_batch_is_refused(store: RunStore) -> None:
    runs = [NewRun("acme", {"i": 1}, idempotency_key="k"), NewRun("acme", {"i": 2},
                                                                  idempotency_key="k")]
    with pytest.raises(ValidationError, match="repeated"):
        await store.enqueue_many("default", runs)
    assert await count_runs(store) == 0


async def test_the_input_bound_is_configurable(store: RunStore) -> None:
    small = RunStore(store.conn_pool, clock=store.clock, max_input_bytes=100)
    with pytest.raises(ValidationError, match="over the bound of 100 bytes"):
        await small.enqueue("default", "acme", {"x": "y" * 100})
    assert (await small.enqueue("default", "acme", {"x": "y"})).inserted


async def test_unknown_pool_names_the_pool(store: RunStore) -> None:
    with pytest.raises(UnknownPool) as err:
        await store.enqueue("no-such-pool", "acme", {})
    assert err.value.field == "pool"
    assert "no-such-pool" in str(err.value)


@pytest.mark.parametrize(
    ("pool", "field"),
    [
        (Pool("ok", max_attempts=0), "max_attempts"),
        (Pool("ok", lease_s=0), "lease_s"),
        (Pool("ok", default_max_in_flight=-1), "default_max_in_flight"),
        (Pool("ok", priority_aging_s=-5), "priority_aging_s"),
        (Pool("Not_OK"), "pool"),
    ],
)
async def test_bad_pool_settings_are_refused(store: RunStore, pool: Pool, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        await store.upsert_pool(pool)
    assert err.value.field == field
    assert [p.name for p in await store.list_pools()] == ["default"]


async def test_bad_events_and_steps_are_refused(store: RunStore) -> None:
    await store.enqueue("default", "acme", {})
    (lease,) = await store.claim("default", "w", 1)
    with pytest.raises(ValidationError, match="kind"):
        await store.record_event(lease, "Bad Kind!", {})
    with pytest.raises(ValidationError, match="data"):
        await store.record_event(lease, "message", {"blob": "x" * 70_000})
    with pytest.raises(ValidationError, match="step_key"):
        await store.record_step(lease, "", {})
    assert await store.events_after(lease.run_id) == []
    assert (await store.get(lease.run_id)).status == "leased"
    # An agent's odd error code never fails the write that ends its run: it is
    # stored as invalid_error_code, the original named in the message.
    assert await store.nack(lease, "Not A Code", "x") == "pending"
    run = await store.get(lease.run_id)
    assert run.error_code == "invalid_error_code"
    assert run.error_message is not None
    assert "'Not A Code'" in run.error_message


async def test_claim_batch_and_list_limits(store: RunStore) -> None:
    with pytest.raises(ValidationError, match="n"):
        await store.claim("default", "w", 0)
    with pytest.raises(ValidationError, match="limit"):
        await store.list_runs(limit=0)
    with pytest.raises(ValidationError, match="status"):
        await store.list_runs(status="running")
    assert issubclass(ValidationError, RunleaseError)


@pytest.mark.parametrize(("call", "field"), [
    (lambda s: s.delete_finished(0), "retention_s"),
    (lambda s: s.delete_finished(-3600), "retention_s"),
    (lambda s: s.delete_finished(3600, batch=0), "batch"),
    (lambda s: s.reap(batch=-1), "batch"),
], ids=["retention zero", "retention negative", "retention batch zero", "reap batch negative"])
async def test_bad_retention_and_reap_arguments_delete_nothing(
    store: RunStore, clock: Any, call: Any, field: str
) -> None:
    # A zero or negative retention period would make every finished run "old".
    run = (await store.enqueue("default", "acme", {"i": 1})).run
    (lease,) = await store.claim("default", "w", 1)
    await store.ack(lease)
    clock.advance(10)
    with pytest.raises(ValidationError) as info:
        await call(store)
    assert info.value.field == field
    assert (await store.get(run.id)).status == "done"
