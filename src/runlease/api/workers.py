"""GET /v1/workers (admin): the registered worker processes of each pool,
from the agent_run_workers registry (db/workers.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from runlease.api.deps import Admin, Store
from runlease.api.schemas import POOL_PATTERN
from runlease.core import bounds
from runlease.db.workers import MAX_WORKER_LIST, WorkerRow

router = APIRouter(prefix="/v1")


class WorkerOut(BaseModel):
    id: str = Field(description="The worker's identity: pod UID:boot id:pid.")
    pool: str
    version: str = Field(description="The runlease version the worker runs.")
    concurrency: int = Field(description="Runs it may hold at once.")
    runs_held: int = Field(description="Runs it held at its last heartbeat.")
    started_at: datetime
    heartbeat_at: datetime = Field(description="Its last heartbeat.")
    expires_at: datetime = Field(description="Past this without a heartbeat, it is gone.")
    alive: bool = Field(description="Its row has not expired (by the database clock).")

    @classmethod
    def of(cls, w: WorkerRow) -> WorkerOut:
        return cls(id=w.id, pool=w.pool, version=w.version, concurrency=w.concurrency,
                   runs_held=w.runs_held, started_at=w.started_at,
                   heartbeat_at=w.heartbeat_at, expires_at=w.expires_at, alive=w.alive)


class WorkerList(BaseModel):
    items: list[WorkerOut]


@router.get("/workers", response_model=WorkerList)
async def workers(
    who: Admin, store: Store,
    pool: Annotated[str | None, Query(min_length=1, max_length=bounds.POOL_MAX_CHARS,
                                      pattern=POOL_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_WORKER_LIST)] = 100,
) -> WorkerList:
    """Registered workers, by pool then start time (admin); a worker that
    stopped without deregistering shows `alive: false` until the reaper
    deletes its row."""
    return WorkerList(items=[WorkerOut.of(w) for w in await store.list_workers(pool,
                                                                               limit=limit)])
