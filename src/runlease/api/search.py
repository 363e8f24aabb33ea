"""GET /v1/runs's filters: query parameters into a RunFilter, scoped to the caller.

A tenant token always searches its own runs (`tenant` naming another tenant
is refused); an admin searches every tenant's, or one with `tenant`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated
from uuid import UUID

from fastapi import Query
from pydantic import AwareDatetime, BeforeValidator

from runlease.api.auth import Principal
from runlease.api.errors import ErrorAnswer
from runlease.api.schemas import POOL_PATTERN, Status, not_a_number
from runlease.core import bounds, run_options
from runlease.core.states import RunStatus
from runlease.db.run_search import RunFilter

# key=value (kubectl's selector) or key:value, the value bounded in the
# pattern itself (the parameter's own length bound alone would let a short
# key carry an over-long value). A key has neither `=` nor `:`, so the first
# of them ends it, whatever the value holds.
LABEL_FILTER_PATTERN = (run_options.LABEL_KEY_PATTERN[:-1] + "[=:]"
                        + run_options.LABEL_VALUE_PATTERN[1:-2]
                        + f"{{0,{run_options.LABEL_VALUE_MAX_CHARS}}}$")
LABEL_FILTER_MAX_CHARS = run_options.LABEL_KEY_MAX_CHARS + 1 + run_options.LABEL_VALUE_MAX_CHARS

StatusQ = Annotated[list[Status] | None, Query(
    max_length=len(RunStatus), description="Any of these statuses (repeat the parameter).",
    examples=[["pending", "leased"]])]
PoolQ = Annotated[str | None, Query(min_length=1, max_length=bounds.POOL_MAX_CHARS,
                                    pattern=POOL_PATTERN, examples=["default"])]
LabelQ = Annotated[list[Annotated[str, Query(min_length=3, max_length=LABEL_FILTER_MAX_CHARS,
                                             pattern=LABEL_FILTER_PATTERN)]] | None, Query(
    max_length=run_options.LABELS_MAX,
    description="`key=value` (or `key:value`); repeat for several, all must match.",
    examples=[["team=search"]])]
TimeQ = Annotated[AwareDatetime | None, BeforeValidator(not_a_number), Query(
    description="RFC 3339 with its offset; `_after` is inclusive, `_before` exclusive.",
    examples=["2026-12-01T00:00:00Z"])]
KeyQ = Annotated[str | None, Query(min_length=1, max_length=bounds.KEY_MAX_CHARS,
                                   pattern=r"^[^\x00-\x20\x7f]+$",
                                   description="The run submitted with this Idempotency-Key "
                                               "(admins: with `tenant`).",
                                   examples=["nightly-1"])]
IdPrefixQ = Annotated[str | None, Query(
    min_length=8, max_length=36,
    pattern=r"^(?:[0-9a-fA-F]-?){7}[0-9a-fA-F](?:-?[0-9a-fA-F]){0,24}-?$",
    description="Runs whose id starts with this (at least 8 hex digits): how the CLI "
                "and the console find a run by the start of its id.",
    examples=["01a24ca5-46fc"])]
ThreadQ = Annotated[str | None, Query(min_length=1, max_length=bounds.THREAD_MAX_CHARS,
                                      pattern=bounds.THREAD_PATTERN,
                                      description="A thread's runs (admins: with `tenant`).",
                                      examples=["conv-42"])]
TenantQ = Annotated[str | None, Query(min_length=1, max_length=bounds.TENANT_MAX_CHARS,
                                      pattern=r"^[^\x00-\x20\x7f]+$",
                                      description="Admin: one tenant's runs. A tenant token "
                                                  "may name only its own tenant.",
                                      examples=["acme"])]


def split_label(item: str) -> tuple[str, str]:
    """`key=value` or `key:value`: split at the first `=` or `:` (a key has
    neither)."""
    cut = min((i for i in (item.find("="), item.find(":")) if i >= 0), default=len(item))
    return item[:cut], item[cut + 1:]


def run_filter(who: Principal, *, status: Sequence[str] | None = None, pool: str | None = None,
               label: list[str] | None = None, created_after: AwareDatetime | None = None,
               created_before: AwareDatetime | None = None,
               finished_after: AwareDatetime | None = None,
               finished_before: AwareDatetime | None = None,
               idempotency_key: str | None = None, tenant: str | None = None,
               parent_run_id: UUID | None = None, id_prefix: str | None = None,
               thread_id: str | None = None) -> RunFilter:
    """The filter the caller may run: its own tenant's, or any for an admin."""
    scope = who.scope
    if scope is not None and tenant is not None and tenant != scope:
        # 403 as for a submit naming another tenant: the token may not.
        raise ErrorAnswer(403, "forbidden", "tenant: a tenant token lists its own runs only",
                          "tenant")
    if scope is None and tenant is None and idempotency_key is not None:
        # A key is a tenant's own: an admin names whose (as an admin submit does).
        raise ErrorAnswer(403, "tenant_required", "idempotency_key: an admin token names "
                                                  "the tenant (`tenant`) with a key", "tenant")
    if scope is None and tenant is None and thread_id is not None:
        raise ErrorAnswer(403, "tenant_required", "thread_id: an admin token names "
                                                  "the tenant (`tenant`) with a thread", "tenant")
    labels = tuple(split_label(item) for item in label or ())
    return RunFilter(
        tenant_id=scope if scope is not None else tenant,
        statuses=tuple(RunStatus(s) for s in dict.fromkeys(status or ())), pool=pool,
        labels=labels, created_after=created_after, created_before=created_before,
        finished_after=finished_after, finished_before=finished_before,
        idempotency_key=idempotency_key, parent_run_id=parent_run_id, id_prefix=id_prefix,
        thread_id=thread_id,
    ).validated()
