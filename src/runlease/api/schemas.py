"""Request and response bodies, as the OpenAPI spec shows them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
    model_validator,
)

from runlease.core import bounds, run_options
from runlease.core.defaults import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY_AGING_S,
    DEFAULT_RETENTION_S,
)
from runlease.db.models import Pool, Run, Step, TenantLimit

POOL_PATTERN = bounds.POOL_PATTERN
LabelKey = Annotated[str, StringConstraints(min_length=1,
                                            max_length=run_options.LABEL_KEY_MAX_CHARS,
                                            pattern=run_options.LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, StringConstraints(max_length=run_options.LABEL_VALUE_MAX_CHARS,
                                              pattern=run_options.LABEL_VALUE_PATTERN)]
Labels = dict[LabelKey, LabelValue]
Status = Literal["pending", "leased", "done", "dead", "cancelled"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BudgetIn(Strict):
    max_turns: StrictInt | None = Field(None, ge=1, le=100_000)
    max_tool_calls: StrictInt | None = Field(None, ge=0, le=1_000_000)
    deadline_s: StrictInt | StrictFloat | None = Field(None, gt=0, le=30 * 24 * 3600)


class RunCreate(Strict):
    """A run to enqueue. Admin callers name the tenant; tenants may not."""

    input: dict[str, Any] = Field(description="The agent's input, a JSON object.")
    pool: str = Field("default", min_length=1, max_length=bounds.POOL_MAX_CHARS,
                      pattern=POOL_PATTERN)
    priority: StrictInt = Field(0, ge=bounds.PRIORITY_MIN, le=bounds.PRIORITY_MAX)
    max_attempts: StrictInt | None = Field(None, ge=bounds.MAX_ATTEMPTS_MIN,
                                           le=bounds.MAX_ATTEMPTS_MAX)
    budget: BudgetIn | None = None
    tenant_id: str | None = Field(None, min_length=1, max_length=bounds.TENANT_MAX_CHARS,
                                  description="Admin only: the tenant the run belongs to.")
    labels: Labels | None = Field(
        None, max_length=run_options.LABELS_MAX,
        description=f"A string map (at most {run_options.LABELS_MAX} labels; keys "
                    f"1-{run_options.LABEL_KEY_MAX_CHARS} characters, values at most "
                    f"{run_options.LABEL_VALUE_MAX_CHARS}) to find runs by "
                    "(`GET /v1/runs?label=key:value`).",
        examples=[{"team": "search", "suite": "nightly-eval"}])
    run_at: AwareDatetime | None = Field(
        None, description="Not before this time (RFC 3339 with its offset; at most a year "
                          "ahead; a past time means now). Not with `delay_s`.",
        examples=["2026-12-01T09:00:00Z"])
    delay_s: StrictFloat | None = Field(
        None, ge=0, le=run_options.MAX_DELAY_S,
        description="Not before this many seconds from now. Not with `run_at`.",
        examples=[300])

    @model_validator(mode="after")
    def _one_start(self) -> Self:
        if self.run_at is not None and self.delay_s is not None:
            raise ValueError("give run_at or delay_s, not both")
        return self


class LeaseInfo(BaseModel):
    """Who holds the run: shown to admins only."""

    locked_by: str
    locked_until: datetime
    lease_epoch: int


class RunOut(BaseModel):
    id: UUID
    pool: str
    tenant_id: str
    status: Status
    priority: int
    attempts: int
    max_attempts: int
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
    last_event_seq: int = Field(description="The seq of the run's latest event; 0 if none.")
    lease: LeaseInfo | None = None
    labels: dict[str, str] = Field(default_factory=dict,
                                   description="The labels given at submit.",
                                   examples=[{"team": "search"}])

    @classmethod
    def of(cls, run: Run, *, admin: bool) -> RunOut:
        lease = None
        if admin and run.locked_by is not None and run.locked_until is not None:
            lease = LeaseInfo(locked_by=run.locked_by, locked_until=run.locked_until,
                              lease_epoch=run.lease_epoch)
        # Typed rows from the store: nothing to validate (a page or a batch
        # of a thousand runs would pay for it per field).
        return cls.model_construct(
            id=run.id, pool=run.pool, tenant_id=run.tenant_id, status=run.status.value,
            priority=run.priority, attempts=run.attempts, max_attempts=run.max_attempts,
            input=run.input_json, budget=run.budget_json, result=run.result_json,
            error_code=run.error_code, error_message=run.error_message,
            idempotency_key=run.idempotency_key, cancel_requested_at=run.cancel_requested_at,
            available_at=run.available_at, created_at=run.created_at,
            updated_at=run.updated_at, finished_at=run.finished_at,
            last_event_seq=run.event_seq, lease=lease, labels=run.labels,
        )


class RunPage(BaseModel):
    items: list[RunOut]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page.")


class StepOut(BaseModel):
    """A committed durable step: its result as stored (redacted), and the
    attempt and lease epoch that committed it."""

    key: str
    result: Any = None
    attempt: int
    lease_epoch: int
    created_at: datetime

    @classmethod
    def of(cls, step: Step) -> StepOut:
        return cls(key=step.step_key, result=step.result, attempt=step.attempt,
                   lease_epoch=step.lease_epoch, created_at=step.created_at)


class StepPage(BaseModel):
    items: list[StepOut]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page.")


class StreamToken(BaseModel):
    token: str
    expires_at: int = Field(description="Unix time after which the token is refused.")
    url: str = Field(description="The run's event stream, with the token.")


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


class PriorityBand(Strict):
    """The priorities a tenant may submit in a pool; outside them a submit is
    refused with 422. Priority orders only the tenant's own runs."""

    min: StrictInt = Field(bounds.PRIORITY_MIN, ge=bounds.PRIORITY_MIN, le=bounds.PRIORITY_MAX)
    max: StrictInt = Field(bounds.PRIORITY_MAX, ge=bounds.PRIORITY_MIN, le=bounds.PRIORITY_MAX)


class PoolIn(Strict):
    """A pool's whole settings: a field left out takes its default (PUT
    replaces; `runlease pools upsert` reads the pool first and changes only
    what it is given)."""

    max_attempts: StrictInt = Field(DEFAULT_MAX_ATTEMPTS, ge=bounds.MAX_ATTEMPTS_MIN,
                                    le=bounds.MAX_ATTEMPTS_MAX)
    lease_s: StrictInt = Field(DEFAULT_LEASE_S, ge=bounds.LEASE_S_MIN, le=bounds.LEASE_S_MAX,
                               description="Lease length workers claim and renew with "
                                           "(read at worker start).")
    default_max_in_flight: StrictInt | None = Field(None, ge=0, le=bounds.MAX_IN_FLIGHT_MAX)
    priority_aging_s: StrictInt = Field(DEFAULT_PRIORITY_AGING_S, ge=0, le=bounds.AGING_S_MAX)
    retention_s: StrictInt = Field(DEFAULT_RETENTION_S, ge=0, le=bounds.RETENTION_S_MAX,
                                   description="Finished runs older than this are deleted; "
                                               "0 keeps them.")
    paused: StrictBool = Field(False, description="No run of the pool is claimed; submits are "
                                            "accepted and leased runs go on.")
    tool_env: list[str] = Field(
        default_factory=list, max_length=bounds.TOOL_ENV_MAX,
        description="Names of worker environment variables the pool's tools may see.")
    tenant_limits: dict[str, StrictInt] = Field(
        default_factory=dict, max_length=10_000,
        description="Per-tenant caps on runs leased at once.")
    tenant_priority: dict[str, PriorityBand] = Field(
        default_factory=dict, max_length=10_000,
        description="Per-tenant priority bands; tenants not named may use -100..100.")

    def tenants(self) -> dict[str, TenantLimit]:
        names = list(dict.fromkeys([*self.tenant_limits, *self.tenant_priority]))
        return {t: TenantLimit(
                    self.tenant_limits.get(t),
                    *((b.min, b.max) if (b := self.tenant_priority.get(t)) else (None, None)))
                for t in names}


class PoolOut(BaseModel):
    name: str
    max_attempts: int
    lease_s: int
    default_max_in_flight: int | None
    priority_aging_s: int
    retention_s: int
    paused: bool
    tool_env: list[str]
    tenant_limits: dict[str, int]
    tenant_priority: dict[str, PriorityBand]

    @classmethod
    def of(cls, pool: Pool, tenants: dict[str, TenantLimit]) -> PoolOut:
        return cls(name=pool.name, max_attempts=pool.max_attempts, lease_s=pool.lease_s,
                   default_max_in_flight=pool.default_max_in_flight,
                   priority_aging_s=pool.priority_aging_s, retention_s=pool.retention_s,
                   paused=pool.paused, tool_env=list(pool.tool_env),
                   tenant_limits={t: s.max_in_flight for t, s in tenants.items()
                                  if s.max_in_flight is not None},
                   tenant_priority={
                       t: PriorityBand(
                           min=bounds.PRIORITY_MIN if s.priority_min is None else s.priority_min,
                           max=bounds.PRIORITY_MAX if s.priority_max is None else s.priority_max)
                       for t, s in tenants.items()
                       if s.priority_min is not None or s.priority_max is not None})
