"""GET /v1/runs's filters: query parameters into a RunFilter, scoped to the caller.

A tenant token always searches its own runs (`tenant` naming another tenant
is refused); an admin searches every tenant's, or one with `tenant`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import Query
from pydantic import AwareDatetime

from runlease.api.auth import Principal
from runlease.api.errors import invalid
from runlease.api.schemas import POOL_PATTERN, Status
from runlease.core import bounds, run_options
from runlease.core.states import RunStatus
from runlease.db.run_search import RunFilter

LABEL_FILTER_PATTERN = (run_options.LABEL_KEY_PATTERN[:-1] + ":"
                        + run_options.LABEL_VALUE_PATTERN[1:])
LABEL_FILTER_MAX_CHARS = run_options.LABEL_KEY_MAX_CHARS + 1 + run_options.LABEL_VALUE_MAX_CHARS

StatusQ = Annotated[list[Status] | None, Query(
    max_length=len(RunStatus), description="Any of these statuses (repeat the parameter).",
    examples=[["pending", "leased"]])]
PoolQ = Annotated[str | None, Query(min_length=1, max_length=bounds.POOL_MAX_CHARS,
                                    pattern=POOL_PATTERN, examples=["default"])]
LabelQ = Annotated[list[Annotated[str, Query(min_length=3, max_length=LABEL_FILTER_MAX_CHARS,
                                             pattern=LABEL_FILTER_PATTERN)]] | None, Query(
    max_length=run_options.LABELS_MAX,
    description="`key:value`; repeat for several, all must match.",
    examples=[["team:search"]])]
TimeQ = Annotated[AwareDatetime | None, Query(
    description="RFC 3339 with its offset; `_after` is inclusive, `_before` exclusive.",
    examples=["2026-12-01T00:00:00Z"])]
KeyQ = Annotated[str | None, Query(min_length=1, max_length=bounds.KEY_MAX_CHARS,
                                   pattern=r"^[^\x00-\x20\x7f]+$",
                                   description="The run submitted with this Idempotency-Key "
                                               "(admins: with `tenant`).",
                                   examples=["nightly-1"])]
TenantQ = Annotated[str | None, Query(min_length=1, max_length=bounds.TENANT_MAX_CHARS,
                                      pattern=r"^[^\x00-\x20\x7f]+$",
                                      description="Admin: one tenant's runs. A tenant token "
                                                  "may name only its own tenant.",
                                      examples=["acme"])]


def run_filter(who: Principal, *, status: Sequence[str] | None = None, pool: str | None = None,
               label: list[str] | None = None, created_after: AwareDatetime | None = None,
               created_before: AwareDatetime | None = None,
               finished_after: AwareDatetime | None = None,
               finished_before: AwareDatetime | None = None,
               idempotency_key: str | None = None, tenant: str | None = None) -> RunFilter:
    """The filter the caller may run: its own tenant's, or any for an admin."""
    scope = who.scope
    if scope is not None and tenant is not None and tenant != scope:
        raise invalid("tenant", "a tenant token lists its own runs only")
    labels = tuple((k, v) for k, _, v in (item.partition(":") for item in label or ()))
    return RunFilter(
        tenant_id=scope if scope is not None else tenant,
        statuses=tuple(RunStatus(s) for s in dict.fromkeys(status or ())), pool=pool,
        labels=labels, created_after=created_after, created_before=created_before,
        finished_after=finished_after, finished_before=finished_before,
        idempotency_key=idempotency_key,
    ).validated()
