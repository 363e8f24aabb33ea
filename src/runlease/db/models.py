"""Typed rows the store returns."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from typing import Any, Self
from uuid import UUID

from runlease.core.defaults import DEFAULT_LEASE_S, DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY_AGING_S

# Re-exported: the operator's spec.py imports it from here.
from runlease.core.defaults import DEFAULT_RETENTION_S as DEFAULT_RETENTION_S
from runlease.core.run_fields import RunHead
from runlease.core.states import RunStatus

_NAMES: dict[type[Any], tuple[str, ...]] = {}


def _names(cls: type[Any]) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def _pick(cls: type[Any], row: dict[str, Any]) -> dict[str, Any]:
    # Rows may carry more columns than the dataclass (a newer schema, or
    # statement extras such as `inserted`); take the ones we know. Field
    # names are cached: every row of a listing passes here.
    return {name: row[name] for name in _names(cls) if name in row}


class FromRow:
    """`from_row` for a dataclass whose fields are all columns of the row."""

    __slots__ = ()

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        return cls(**_pick(cls, row))


@dataclass(frozen=True, slots=True, kw_only=True)
class Run(RunHead):
    """A run as stored: its columns by their names."""

    status: RunStatus
    lease_epoch: int
    available_at: datetime
    input_json: dict[str, Any]
    budget_json: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    fair_seq: int = 0
    # The lease's expiry: its holder incarnation's (agent_run_workers), where
    # the statement that read the run joined it; None otherwise.
    locked_until: datetime | None = None
    locked_by: str | None = None
    cancel_requested_at: datetime | None = None
    result_json: Any = None
    idempotency_key: str | None = None
    event_seq: int = 0
    error_code: str | None = None
    error_message: str | None = None
    finished_at: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)
    # The run's retry policy (None: the defaults of core/backoff.py).
    backoff_base_s: int | None = None
    backoff_cap_s: int | None = None
    non_retryable_codes: list[str] | None = None
    # Usage over every attempt (db/usage.py).
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    turns_used: int = 0
    tool_calls_used: int = 0
    parent_run_id: UUID | None = None
    awaiting_children: bool = False
    # Its thread (issue 27): its place in submit order, and whether a
    # multitask 'rollback' submit interrupted it.
    thread_id: str | None = None
    thread_seq: int | None = None
    rolled_back: bool = False
    concurrency_key: str | None = None  # its key: pool limits per key (issue 27)
    # Set while parked behind its thread's head or its key's limit: when it was due.
    thread_due_at: datetime | None = None
    key_due_at: datetime | None = None
    # Its inbox (issue 28): messages sent to it, and taken by its agent.
    inbox_seq: int = 0
    inbox_read: int = 0
    rerun_of: UUID | None = None  # the run it reruns (POST /v1/runs/{id}/rerun)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        values = _pick(cls, row)
        values["status"] = RunStatus(values["status"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Lease:
    """What a worker holds after a claim: the run and its fencing token.

    `run` carries what a worker needs; fields only the control plane reads
    (idempotency_key, fair_seq, event_seq, result and error) are left at
    their defaults. Read the run with RunStore.get for all of it."""

    run: Run
    worker: str

    @property
    def run_id(self) -> UUID:
        return self.run.id

    @property
    def epoch(self) -> int:
        return self.run.lease_epoch


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    run: Run
    inserted: bool  # False: an earlier run with the same idempotency key


@dataclass(frozen=True, slots=True)
class ReapResult:
    to_pending: int = 0
    to_dead: int = 0
    to_cancelled: int = 0
    reaped: tuple[tuple[UUID, str, str, str], ...] = ()  # (id, pool, tenant, new status)
    ended: tuple[str, ...] = ()  # the worker incarnations this batch ended

    @property
    def total(self) -> int:
        return self.to_pending + self.to_dead + self.to_cancelled


@dataclass(frozen=True, slots=True)
class Event(FromRow):
    run_id: UUID
    seq: int
    kind: str
    data: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Step(FromRow):
    run_id: UUID
    step_key: str
    result: Any
    lease_epoch: int
    attempt: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Pool:
    """A pool's settings: the one source workers, the reaper and the API read.

    lease_s: lease length workers claim and renew with (read at worker start).
    retention_s: finished runs older than this are deleted; 0 keeps them.
    paused: no run of the pool is claimed; submits are accepted.
    tool_env: names of worker environment variables the pool's tools may see.
    """

    name: str
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    lease_s: int = DEFAULT_LEASE_S
    default_max_in_flight: int | None = None
    priority_aging_s: int = DEFAULT_PRIORITY_AGING_S
    retention_s: int = DEFAULT_RETENTION_S
    paused: bool = False
    tool_env: tuple[str, ...] = ()

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        values = _pick(cls, row)
        if "tool_env" in values:
            values["tool_env"] = tuple(values["tool_env"] or ())
        return cls(**values)


@dataclass(frozen=True, slots=True)
class TenantLimit(FromRow):
    """One tenant's settings in a pool; None means "not set".

    max_in_flight: cap on its runs leased at once (None: the pool's
    default_max_in_flight; 0: paused). priority_min/priority_max: the band of
    priorities it may submit (None: -100 / 100); outside it a submit is refused.
    submits_per_minute: more runs submitted in a minute are refused (HTTP
    429). tokens_per_minute: over it (model tokens its runs reported in the
    last minute) none of its runs is claimed until the minute is under it.
    """

    max_in_flight: int | None = None
    priority_min: int | None = None
    priority_max: int | None = None
    submits_per_minute: int | None = None
    tokens_per_minute: int | None = None
