"""A run's fields, defined once: the first ones every layer holds (RunHead:
the server's Run, db/models.py, adds its columns to it), and the run as the
API shows it (RunFields: the API's RunOut, api/schemas.py, and the clients'
RunView, client/views.py, are this plus how each reads itself)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID


@dataclass(frozen=True, slots=True, kw_only=True)
class RunHead:
    id: UUID
    pool: str
    tenant_id: str
    status: str
    priority: int
    attempts: int
    max_attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFields(RunHead):
    """In the order the API's JSON has them. `lease` and `usage` are each
    layer's own type (the API's models, the clients' dicts)."""

    input: dict[str, Any]
    budget: dict[str, Any]
    result: Any = None
    error_code: str | None = None
    error_message: str | None = None
    idempotency_key: str | None = None
    cancel_requested_at: datetime | None = None
    available_at: datetime
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    last_event_seq: int = 0
    lease: object = None  # admins only: who holds the run
    labels: dict[str, str] = field(default_factory=dict)
    backoff_base_s: int | None = None  # the retry policy (None: the defaults)
    backoff_cap_s: int | None = None
    non_retryable_codes: list[str] = field(default_factory=list)
    usage: object = None  # tokens, cost, turns, tool calls: all attempts
    parent_run_id: UUID | None = None
    awaiting_children: bool = False  # pending, waiting for its children
    thread_id: str | None = None  # its thread (issue 27)
    rolled_back: bool = False  # interrupted by a multitask 'rollback' submit
    concurrency_key: str | None = None  # its key: the pool limits runs per key
    # Its inbox (issue 28): {"sent": messages sent to it, "taken": by its agent}.
    messages: dict[str, int] = field(default_factory=lambda: {"sent": 0, "taken": 0})
    rerun_of: UUID | None = None  # the run this one reruns
