"""Bulk cancel and redrive, and re-prioritising a pending run (issue 15).

Tenant-scoped like every route: a tenant's ids and filters reach its own
runs only (another tenant's run is not matched, exactly like one that does
not exist). Redrive is an operator's decision (a dead run failed through
every attempt): admin only, by one id or many, as everywhere else. Each
run an action changes gets an audit event naming who asked and the
operation's id."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fastapi import APIRouter

from runlease.api.actions_schemas import BulkIn, BulkOut, RunFilterIn, RunPatch
from runlease.api.auth import Principal
from runlease.api.deps import Admin, JsonBody, Store, Who
from runlease.api.errors import ErrorAnswer
from runlease.api.schemas import ErrorBody, RunOut
from runlease.api.search import run_filter
from runlease.db.bulk import Action

router = APIRouter(prefix="/v1")

BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    403: {"model": ErrorBody, "description": "`filter.tenant_id` names another tenant than "
                                             "the token's."},
    415: {"model": ErrorBody, "description": "No `Content-Type: application/json`."},
}


def actor(who: Principal) -> str:
    """Who asked, as audit events name them."""
    return "admin" if who.admin else f"tenant:{who.tenant_id}"


def scope_of(where: RunFilterIn | None, who: Principal) -> str | None:
    """The tenant a bulk action is confined to: the token's own, or for an
    admin the filter's tenant_id (None: every tenant)."""
    wanted = where.tenant_id if where is not None else None
    if who.admin:
        return wanted
    if wanted is not None and wanted != who.tenant_id:
        raise ErrorAnswer(403, "forbidden", "filter.tenant_id: a tenant token acts on its own "
                                         "tenant's runs only", "filter.tenant_id")
    return who.tenant_id


async def _bulk(action: Action, body: BulkIn, who: Principal, store: Store) -> BulkOut:
    scope = scope_of(body.filter, who)
    where = None
    if (f := body.filter) is not None:
        # The listing's filter, so a filter means the same runs in both.
        where = run_filter(who, status=f.status, pool=f.pool, label=f.label,
                           created_after=f.created_after, created_before=f.created_before,
                           finished_after=f.finished_after, finished_before=f.finished_before,
                           tenant=scope)
    result = await store.bulk_action(action, by=actor(who), tenant_id=scope, ids=body.ids,
                                     where=where, dry_run=body.dry_run)
    return BulkOut.of(result)


@router.post("/runs/cancel", response_model=BulkOut, dependencies=[JsonBody],
             responses=BODY_ERRORS)
async def bulk_cancel(body: BulkIn, who: Who, store: Store) -> BulkOut:
    """Cancel many runs: those named by `ids` (at most 1,000) or matched by
    `filter`. Pending runs are cancelled at once, leased ones are stopped by
    their workers, finished ones are left alone (not counted). `dry_run`
    counts and changes nothing. Works in batches; over 100,000 matching runs
    it stops (`truncated`): send it again."""
    return await _bulk("cancel", body, who, store)


@router.post("/runs/redrive", response_model=BulkOut, dependencies=[JsonBody],
             responses={**BODY_ERRORS, 403: {"model": ErrorBody,
                                              "description": "Not an admin token."}})
async def bulk_redrive(body: BulkIn, who: Admin, store: Store) -> BulkOut:
    """Send many dead runs back to pending, attempts reset: those named by
    `ids` or matched by `filter` (runs that are not dead are left alone).
    `dry_run` counts and changes nothing. Admin only, as redriving one run
    is: a redrive resets attempts, so a tenant could otherwise retry its
    failing runs forever past max_attempts (issue 32)."""
    return await _bulk("redrive", body, who, store)


@router.patch("/runs/{run_id}", response_model=RunOut, dependencies=[JsonBody],
              responses={409: {"model": ErrorBody, "description": "The run is not pending."},
                         415: BODY_ERRORS[415]})
async def patch_run(run_id: UUID, body: RunPatch, who: Who, store: Store) -> RunOut:
    """Re-prioritise a pending run, within the tenant's band in its pool
    (422 outside it). A run that is no longer pending is a 409."""
    run = await store.reprioritize(run_id, body.priority, by=actor(who), tenant_id=who.scope)
    return RunOut.of(run, admin=who.admin)
