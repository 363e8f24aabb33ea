"""POST /v1/runs/batch: up to 1,000 runs in one request, one statement, all or nothing."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from runlease import metrics
from runlease.api.deps import JsonBody, Store, Waker, Who
from runlease.api.errors import invalid
from runlease.api.schemas import ErrorBody, RunCreate, RunOut
from runlease.core import bounds
from runlease.db.runs import NewRun

MAX_BATCH_RUNS = 1000

router = APIRouter(prefix="/v1")


class RunBatchItem(RunCreate):
    """One run of a batch: the single submit's body, and its idempotency key."""

    idempotency_key: Annotated[str | None, Field(
        None, min_length=1, max_length=bounds.KEY_MAX_CHARS, pattern=r"^[^\x00-\x20\x7f]+$",
        description="As the Idempotency-Key header of a single submit: a key that names an "
                    "existing run with the same input returns that run.",
        examples=["eval-2026-12-01-case-0001"])]


class RunBatchIn(BaseModel):
    runs: list[RunBatchItem] = Field(
        min_length=1, max_length=MAX_BATCH_RUNS,
        description=f"1 to {MAX_BATCH_RUNS} runs; the answer lists them in the same order.",
        examples=[[{"input": {"case": 1}, "labels": {"suite": "nightly"},
                    "idempotency_key": "nightly-1"},
                   {"input": {"case": 2}, "delay_s": 60, "idempotency_key": "nightly-2"}]])


class BatchItemError(BaseModel):
    index: int = Field(description="The refused item's place in `runs`, from 0.",
                       examples=[1])
    code: str = Field(examples=["invalid_request", "unknown_pool", "idempotency_conflict"])
    field: str | None = Field(None, description="The item's field at fault.",
                              examples=["priority"])
    message: str = Field(examples=["priority: must be between -10 and 10 for tenant 'acme' "
                                   "in pool 'default' (the band an admin set), got 90"])


class BatchErrorBody(ErrorBody):
    errors: list[BatchItemError] = Field(
        default_factory=list, description="Each refused item, by index (absent when the "
                                          "body as a whole is malformed).")


class RunBatchOut(BaseModel):
    runs: list[RunOut] = Field(description="In the order given; an item whose idempotency "
                                           "key named an existing run is that run.")
    created: list[bool] = Field(description="Per run: false where its idempotency key named "
                                            "an existing run.", examples=[[True, False]])


@router.post(
    "/runs/batch", status_code=201, response_model=RunBatchOut, dependencies=[JsonBody],
    responses={200: {"model": RunBatchOut,
                     "description": "Nothing new: every item's idempotency key named an "
                                    "existing run."},
               413: {"model": ErrorBody, "description": "Body over max_batch_request_bytes."},
               415: {"model": ErrorBody, "description": "No `Content-Type: application/json`."},
               422: {"model": BatchErrorBody,
                     "description": "Refused as a whole, nothing submitted: `errors` names "
                                    "each refused item by index."}},
)
async def submit_batch(body: RunBatchIn, who: Who, store: Store, waker: Waker) -> Response:
    """Enqueue up to 1,000 runs in one statement, all or nothing. Each item is a
    single submit's body (plus its `idempotency_key`) under the same rules."""
    runs = []
    for i, item in enumerate(body.runs):
        if who.admin and item.tenant_id is None:
            raise invalid(f"runs[{i}].tenant_id", "admin must name the tenant")
        if not who.admin and item.tenant_id not in (None, who.tenant_id):
            raise invalid(f"runs[{i}].tenant_id", "a tenant token submits for its own "
                                                  "tenant only")
        tenant = item.tenant_id if who.admin else who.tenant_id
        assert tenant is not None
        runs.append(NewRun(
            tenant, item.input, item.priority, item.max_attempts,
            None if item.budget is None else item.budget.model_dump(exclude_none=True),
            item.idempotency_key, item.labels, item.run_at, item.delay_s, item.pool))
    results = await store.enqueue_many(body.runs[0].pool, runs, notify=False)
    for r in results:
        if r.inserted:
            metrics.RUNS_SUBMITTED.labels(r.run.pool).inc()
    waker.wake({r.run.pool for r in results
                if r.inserted and r.run.available_at <= r.run.created_at})
    out = RunBatchOut.model_construct(runs=[RunOut.of(r.run, admin=who.admin) for r in results],
                                      created=[r.inserted for r in results])
    # Serialized here, once: returned as a model, it would be validated again.
    return Response(out.model_dump_json(), media_type="application/json",
                    status_code=201 if any(r.inserted for r in results) else 200)
