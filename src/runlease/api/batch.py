"""POST /v1/runs/batch: up to 1,000 runs in one request, one statement, all or nothing."""

from __future__ import annotations

from collections import Counter
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field
from pydantic_core import to_json

from runlease import metrics
from runlease.api.auth import Principal
from runlease.api.deps import JsonBody, Store, Waker, Who
from runlease.api.errors import ErrorAnswer
from runlease.api.rates import submit_slots
from runlease.api.routes import keyed_of, new_run, tenant_for
from runlease.api.schemas import ErrorBody, RunCreate, RunOut, run_json, run_out_fields
from runlease.api.wakeups import PoolWaker
from runlease.core import bounds
from runlease.db.keyed import Keyed
from runlease.db.models import EnqueueResult
from runlease.db.runs import NewRun
from runlease.db.store import Conn, RunStore
from runlease.errors import (
    BatchConflict,
    BatchRefused,
    IdempotencyConflict,
    ItemError,
    ThreadBusy,
    UnknownPool,
    ValidationError,
)

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
               429: {"model": ErrorBody, "description": "Over a tenant's submit rate; see "
                                                         "Retry-After. Nothing submitted."},
               409: {"model": ErrorBody,
                     "description": "An item with `multitask: reject` names a thread that "
                                    "has an unfinished run (`thread_busy`, the item in "
                                    "`field`). Nothing submitted."},
               422: {"model": BatchErrorBody,
                     "description": "Refused as a whole, nothing submitted: `errors` names "
                                    "each refused item by index."}},
)
async def submit_batch(body: RunBatchIn, who: Who, store: Store, waker: Waker) -> Response:
    """Enqueue up to 1,000 runs in one statement, all or nothing. Each item is a
    single submit's body (plus its `idempotency_key`) under the same rules."""
    return await answer_batch(body, who, store, waker)


async def answer_batch(body: RunBatchIn, who: Principal, store: RunStore,
                       waker: PoolWaker) -> Response:
    """The route's answer, which api/fast_batch.py also gives."""
    runs = []
    alone = False  # an item with a parent, a webhook, a thread or a key
    keyed: list[Keyed | None] = []
    own = None if who.admin else who.tenant_id
    for i, item in enumerate(body.runs):
        tenant = item.tenant_id
        if own is None or (tenant is not None and tenant != own):
            try:
                tenant = tenant_for(tenant, who)  # a 403 as for one submit
            except ErrorAnswer as exc:
                field = f"runs[{i}].tenant_id"
                raise ErrorAnswer(exc.status, exc.code, f"runs[{i}].{exc.message}",
                                  field) from None
        # The body was JSON (JsonBody, or api/fast_batch.py).
        runs.append(new_run(item, tenant or own or "", item.idempotency_key,
                            input_parsed=True))
        keyed.append(keyed_of(item))
        alone = (alone or item.parent_run_id is not None or item.webhook_url is not None
                 or keyed[-1] is not None)
    if alone:
        return _answer(await _enqueue(store, body, runs, keyed, admin=who.admin), waker,
                       admin=who.admin)
    async with submit_slots(store, _wanted(body, runs)) as conn:
        done = await store.enqueue_batch(body.runs[0].pool, runs, conn=conn)
    # One increment per pool, not per run (1.7 ms of a batch of 1,000).
    for pool, n in done.submitted.items():
        metrics.RUNS_SUBMITTED.labels(pool).inc(n)
    waker.wake(done.ready)
    # New runs come as JSON text (db/enqueue_batch.py); a run an idempotency
    # key named is rendered here.
    texts = [run if isinstance(run, str) else run_json(run, admin=who.admin).decode()
             for run in done.runs]
    created = ",".join("true" if c else "false" for c in done.created)
    return Response(f'{{"runs":[{",".join(texts)}],"created":[{created}]}}'.encode(),
                    media_type="application/json",
                    status_code=201 if any(done.created) else 200)


def _answer(results: list[EnqueueResult], waker: PoolWaker, *, admin: bool) -> Response:
    for pool, n in Counter(r.run.pool for r in results if r.inserted).items():
        metrics.RUNS_SUBMITTED.labels(pool).inc(n)
    waker.wake({r.run.pool for r in results
                if r.inserted and r.run.available_at <= r.run.created_at})
    # Rendered by pydantic-core from plain dicts, once: models for a thousand
    # runs cost more than the statement (see docs/benchmarks.md).
    body_json = to_json({"runs": [run_out_fields(r.run, admin=admin) for r in results],
                         "created": [r.inserted for r in results]})
    return Response(body_json, media_type="application/json",
                    status_code=201 if any(r.inserted for r in results) else 200)


def _wanted(body: RunBatchIn, runs: list[NewRun]) -> Counter[tuple[str, str]]:
    """The batch's runs per (pool, tenant), for the submit rates."""
    return Counter((r.pool or body.runs[0].pool, r.tenant_id) for r in runs)


async def _enqueue(store: RunStore, body: RunBatchIn, runs: list[NewRun],
                   keyed: list[Keyed | None], *, admin: bool) -> list[EnqueueResult]:
    """Rates, parents and webhook URLs checked, and the runs inserted, in one
    transaction: a 429, a refused parent or URL, or a busy thread of a
    `multitask: reject` item writes none of the batch. Items with a thread
    or a key go in order, one at a time, under the same rules as a single
    submit (their rows locked first, in one order: db/keyed.py); the
    interrupts they ask for are made after the commit."""
    pool = body.runs[0].pool
    interrupts: list[tuple[UUID, str]] = []
    async with submit_slots(store, _wanted(body, runs)) as conn:
        for i, item in enumerate(body.runs):
            if item.parent_run_id is not None:
                await store.check_parent(item.parent_run_id, runs[i].tenant_id, conn=conn,
                                         admin=admin)
            if item.webhook_url is not None:
                await store.check_webhook_url(item.webhook_url, conn=conn)
        if not any(keyed):
            results = await store.enqueue_many(pool, runs, notify=False, conn=conn)
        else:
            results = await _enqueue_keyed(store, pool, runs, keyed, interrupts, conn)
        for i, item in enumerate(body.runs):
            if not results[i].inserted:
                continue
            if item.parent_run_id is not None:
                results[i] = EnqueueResult(await store.set_parent(
                    results[i].run, item.parent_run_id, conn=conn), True)
            if item.webhook_url is not None:
                await store.add_webhook(results[i].run.id, runs[i].tenant_id, item.webhook_url,
                                        conn=conn)
    for run_id, tenant_id in interrupts:
        await store.interrupt(run_id, tenant_id)
    return results


async def _enqueue_keyed(store: RunStore, pool: str, runs: list[NewRun],
                         keyed: list[Keyed | None], interrupts: list[tuple[UUID, str]],
                         conn: Conn) -> list[EnqueueResult]:
    """Each run in order, as a single submit would go (db/keyed.py); a
    refused item refuses the batch, named by its index."""
    store.check_batch(pool, runs)  # every item's own form first, all named
    await store.lock_keyed([(r.pool or pool, r.tenant_id, k)
                            for r, k in zip(runs, keyed, strict=True) if k is not None],
                           conn=conn)
    results = []
    for i, (run, k) in enumerate(zip(runs, keyed, strict=True)):
        try:
            joined = await store.submit_keyed(run.pool or pool, run, k, conn=conn)
        except ThreadBusy as exc:
            raise ErrorAnswer(409, "thread_busy", f"runs[{i}]: {exc}; nothing was submitted",
                              f"runs[{i}].thread_id") from None
        except IdempotencyConflict as exc:
            raise BatchConflict([ItemError(i, "idempotency_conflict", "idempotency_key",
                                           str(exc))], exc) from None
        except ValidationError as exc:
            code = "unknown_pool" if isinstance(exc, UnknownPool) else "invalid_request"
            raise BatchRefused([ItemError(i, code, exc.field, exc.message)]) from None
        results.append(joined.result)
        if joined.interrupt is not None:
            interrupts.append((joined.interrupt, run.tenant_id))
    return results
