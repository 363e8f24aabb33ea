"""GET /v1/threads/{thread_id} and its runs (issue 27). A thread is a
tenant's own: a tenant token sees its own threads only (another tenant's
thread of the same name reads as one never used: 404, no hint), an admin
names the tenant with `tenant`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from runlease.api.auth import Principal
from runlease.api.deps import Store, Who
from runlease.api.errors import ErrorAnswer
from runlease.api.schemas import ErrorBody, RunOut
from runlease.api.search import TenantQ
from runlease.core import bounds
from runlease.db.threads import MAX_THREAD_PAGE

router = APIRouter(prefix="/v1")

ThreadPath = Annotated[str, Path(min_length=1, max_length=bounds.THREAD_MAX_CHARS,
                                 pattern=bounds.THREAD_PATTERN)]


class ThreadOut(BaseModel):
    """A thread: its head is the active run, or the next to start."""

    thread_id: str
    tenant_id: str
    head_run_id: UUID | None = Field(description="The thread's active run, or the next to "
                                                 "start; null when every run finished.")
    head_status: str | None
    runs: int = Field(description="Runs submitted to the thread, ever.")
    latest_run_id: UUID | None = Field(description="The newest done run not rolled back: "
                                                   "the thread's latest answer.")
    created_at: datetime
    updated_at: datetime


class ThreadRunPage(BaseModel):
    items: list[RunOut]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page.")


NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such thread of this tenant."},
    403: {"model": ErrorBody,
          "description": "`tenant` names another tenant, or an admin left it out."}}


def _tenant(who: Principal, tenant: str | None) -> str:
    scope = who.scope
    if scope is not None:
        if tenant is not None and tenant != scope:
            raise ErrorAnswer(403, "forbidden", "tenant: a tenant token reads its own threads "
                                                "only", "tenant")
        return scope
    if tenant is None:
        raise ErrorAnswer(403, "tenant_required", "tenant: an admin token names the thread's "
                                                  "tenant", "tenant")
    return tenant


def _not_found() -> ErrorAnswer:
    return ErrorAnswer(404, "not_found", "thread not found")


@router.get("/threads/{thread_id}", response_model=ThreadOut, responses=NOT_FOUND)
async def get_thread(thread_id: ThreadPath, who: Who, store: Store,
                     tenant: TenantQ = None) -> ThreadOut:
    """A thread: its active (or next) run, its latest answer, how many runs it had."""
    found = await store.get_thread(_tenant(who, tenant), thread_id)
    if found is None:
        raise _not_found()
    return ThreadOut(thread_id=found.thread_id, tenant_id=found.tenant_id,
                     head_run_id=found.head_run_id, head_status=found.head_status,
                     runs=found.runs, latest_run_id=found.latest_run_id,
                     created_at=found.created_at, updated_at=found.updated_at)


@router.get("/threads/{thread_id}/runs", response_model=ThreadRunPage, responses=NOT_FOUND)
async def thread_runs(
    thread_id: ThreadPath, who: Who, store: Store, tenant: TenantQ = None,
    limit: Annotated[int, Query(ge=1, le=MAX_THREAD_PAGE)] = 50,
    cursor: Annotated[str | None, Query(min_length=1, max_length=18,
                                        pattern=r"^[0-9]{1,18}$")] = None,
) -> ThreadRunPage:
    """A thread's runs in submit order (the order they run in), oldest first."""
    scope = _tenant(who, tenant)
    if await store.get_thread(scope, thread_id) is None:
        raise _not_found()
    runs = await store.thread_runs(scope, thread_id, after=int(cursor or 0), limit=limit)
    last = runs[-1].thread_seq if runs and len(runs) == limit else None
    return ThreadRunPage(items=[RunOut.of(r, admin=who.admin) for r in runs],
                         next_cursor=None if last is None else str(last))
