"""Pool bodies of the API: a pool's settings, its tenants' caps, priority
bands and rates (PUT /v1/pools/{name} and what GET answers)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, StrictBool

from runlease.api.schemas import (
    INTEGRAL,
    TOOL_ENV_PATTERN,
    AgingS,
    Attempts,
    InFlight,
    LeaseS,
    Priority,
    RetentionS,
    Strict,
    _keys_are_tenants,
)
from runlease.core import bounds
from runlease.core.defaults import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY_AGING_S,
    DEFAULT_RETENTION_S,
)
from runlease.db.models import Pool, TenantLimit
from runlease.db.workers import PoolService


def _keys_are_tenants_quotas(schema: dict[str, Any]) -> None:
    _keys_are_tenants(schema)
    schema["additionalProperties"] = {"type": "integer", "minimum": 0,
                                      "maximum": bounds.MAX_PENDING_MAX}


class PriorityBand(Strict):
    """The priorities a tenant may submit in a pool (`min` <= `max`); outside
    them a submit is refused with 422. Priority orders only the tenant's own runs."""

    min: Priority = bounds.PRIORITY_MIN
    max: Priority = bounds.PRIORITY_MAX


class TenantRate(Strict):
    """A tenant's rates in a pool (left out: no such rate): runs submitted per
    minute (more is a 429 with Retry-After) and model tokens per minute (a
    tenant over it has no run claimed until its last minute is under it)."""

    submits_per_minute: Annotated[int, Field(strict=True, ge=1,
                                             le=bounds.SUBMITS_PER_MINUTE_MAX),
                                  INTEGRAL] | None = None
    tokens_per_minute: Annotated[int, Field(strict=True, ge=1,
                                            le=bounds.TOKENS_PER_MINUTE_MAX),
                                 INTEGRAL] | None = None


class PoolServiceOut(Strict):
    """Whether a pool is served, now: read-only. GET answers it; a PUT that
    writes a pool read back whole has it checked as documented, then ignored."""

    live_workers: Annotated[int, Field(strict=True, ge=0), INTEGRAL] = Field(
        description="Its workers alive now (registered, heartbeating).")
    claimable: StrictBool = Field(description="One of its runs could be claimed now (pending "
                                              "and due; the pool not paused).")
    unserved: StrictBool = Field(description="Runs are claimable and no live worker serves the "
                                             "pool: they wait until one starts.")


class PoolIn(Strict):
    """A pool's whole settings: a field left out takes its default (PUT
    replaces; `runlease pools upsert` reads the pool first and changes only
    what it is given)."""

    max_attempts: Attempts = DEFAULT_MAX_ATTEMPTS
    lease_s: LeaseS = Field(DEFAULT_LEASE_S, description="Lease length workers claim and "
                                                         "renew with (read at worker start).")
    default_max_in_flight: InFlight | None = None
    priority_aging_s: AgingS = DEFAULT_PRIORITY_AGING_S
    retention_s: RetentionS = Field(DEFAULT_RETENTION_S,
                                    description="Finished runs older than this are deleted; "
                                                "0 keeps them.")
    paused: StrictBool = Field(False, description="No run of the pool is claimed; submits are "
                                            "accepted and leased runs go on.")
    # The store checks each name (bounds.check_tool_env, with messages that
    # say why); the document states the same rule.
    tool_env: list[str] = Field(
        default_factory=list, max_length=bounds.TOOL_ENV_MAX,
        json_schema_extra={"uniqueItems": True,
                           "items": {"type": "string", "pattern": TOOL_ENV_PATTERN}},
        description="Names of worker environment variables the pool's tools may see.")
    tenant_limits: dict[str, Annotated[int, Field(strict=True), INTEGRAL]] = Field(
        default_factory=dict, max_length=10_000,
        description="Per-tenant caps on runs leased at once.",
        json_schema_extra=_keys_are_tenants)
    tenant_priority: dict[str, PriorityBand] = Field(
        default_factory=dict, max_length=10_000,
        description="Per-tenant priority bands; tenants not named may use -100..100.",
        json_schema_extra=_keys_are_tenants)
    tenant_rates: dict[str, TenantRate] = Field(
        default_factory=dict, max_length=10_000,
        description="Per-tenant submit and model-token rates; tenants not named have none.",
        json_schema_extra=_keys_are_tenants)

    default_max_pending: Annotated[int, Field(strict=True, ge=0, le=bounds.MAX_PENDING_MAX),
                                   INTEGRAL] | None = Field(
        bounds.DEFAULT_MAX_PENDING,
        description="Each tenant's quota of waiting (pending) runs in the pool, unless it has "
                    "its own: a submit past it is a 429 queue_full. null: no quota.")
    tenant_max_pending: dict[str, Annotated[int, Field(strict=True, ge=0,
                                                       le=bounds.MAX_PENDING_MAX),
                                            INTEGRAL]] = Field(
        default_factory=dict, max_length=10_000,
        description="Per-tenant quotas of waiting runs; tenants not named have the default.",
        json_schema_extra=_keys_are_tenants_quotas)
    service: PoolServiceOut | None = Field(
        None, description="Read-only (what GET answers): ignored, so that a pool read can be "
                          "written back whole, as clients that knew no such member do.")

    def tenants(self) -> dict[str, TenantLimit]:
        names = list(dict.fromkeys([*self.tenant_limits, *self.tenant_priority,
                                    *self.tenant_rates]))
        out = {}
        for t in names:
            band, rate = self.tenant_priority.get(t), self.tenant_rates.get(t)
            out[t] = TenantLimit(
                self.tenant_limits.get(t), band.min if band else None,
                band.max if band else None, rate.submits_per_minute if rate else None,
                rate.tokens_per_minute if rate else None)
        return out


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
    tenant_rates: dict[str, TenantRate] = Field(default_factory=dict)
    default_max_pending: int | None = None
    tenant_max_pending: dict[str, int] = Field(default_factory=dict)
    service: PoolServiceOut | None = Field(
        None, description="Read-only, now: its live workers, whether a run could be claimed, "
                          "and `unserved` when one could and no live worker serves the pool.")

    @classmethod
    def of(cls, pool: Pool, tenants: dict[str, TenantLimit],
           quotas: tuple[int | None, dict[str, int]] = (None, {}),
           service: PoolService | None = None) -> PoolOut:
        return cls(name=pool.name,
                   service=None if service is None else PoolServiceOut(
                       live_workers=service.live_workers, claimable=service.claimable,
                       unserved=service.unserved), default_max_pending=quotas[0],
                   tenant_max_pending=quotas[1], max_attempts=pool.max_attempts,
                   lease_s=pool.lease_s,
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
                       if s.priority_min is not None or s.priority_max is not None},
                   tenant_rates={
                       t: TenantRate(submits_per_minute=s.submits_per_minute,
                                     tokens_per_minute=s.tokens_per_minute)
                       for t, s in tenants.items()
                       if s.submits_per_minute is not None or s.tokens_per_minute is not None})
