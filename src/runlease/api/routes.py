"""The /v1 routes. A tenant sees and acts on its own runs only: another
tenant's run is a 404, exactly like a run that does not exist, and lease
internals (which worker holds a run) are shown to admins only."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from runlease import metrics, tracing
from runlease.api.auth import Principal
from runlease.api.deps import Admin, Groups, JsonBody, Store, Waker, Who, api_state, bearer
from runlease.api.errors import ErrorAnswer, unauthorized
from runlease.api.feeds import Batch, End, FeedHub, Keepalive, StreamSlot
from runlease.api.pool_schemas import PoolIn, PoolOut
from runlease.api.rates import submit_slot
from runlease.api.schemas import (
    POOL_PATTERN,
    ErrorBody,
    RunCreate,
    RunOut,
    RunPage,
    StepOut,
    StepPage,
    StreamToken,
    run_json,
    run_page_json,
)
from runlease.api.search import (
    IdPrefixQ,
    KeyQ,
    LabelQ,
    PoolQ,
    StatusQ,
    TenantQ,
    ThreadQ,
    TimeQ,
    run_filter,
)
from runlease.api.wakeups import PoolWaker
from runlease.core import bounds
from runlease.core.backoff import RetryPolicy
from runlease.core.states import RunStatus
from runlease.db.models import EnqueueResult, Pool, Run
from runlease.db.runs import NewRun
from runlease.db.singletons import Debounce
from runlease.db.store import RunStore
from runlease.errors import RunNotFound

router = APIRouter(prefix="/v1")

PoolName = Annotated[str | None, Query(min_length=1, max_length=bounds.POOL_MAX_CHARS,
                                       pattern=POOL_PATTERN)]
PoolPath = Annotated[str, Path(min_length=1, max_length=bounds.POOL_MAX_CHARS,
                               pattern=POOL_PATTERN)]
Limit = Annotated[int, Query(ge=1, le=500)]


def page(runs: list[Run], limit: int, *, admin: bool) -> Response:
    return Response(run_page_json(runs, limit, admin=admin), media_type="application/json")


def tenant_for(tenant_id: str | None, who: Principal) -> str:
    """The tenant a run is submitted for. Refused with 403, not 422: the body
    is well formed, the token may not do this with it."""
    if who.admin:
        if tenant_id is None:
            raise ErrorAnswer(403, "tenant_required",
                           "tenant_id: an admin token has no tenant of its own; name the "
                           "run's tenant", "tenant_id")
        return tenant_id
    if tenant_id is not None and tenant_id != who.tenant_id:
        raise ErrorAnswer(403, "forbidden", "tenant_id: a tenant token submits for its own "
                                         "tenant only", "tenant_id")
    assert who.tenant_id is not None
    return who.tenant_id


def retry_policy(body: RunCreate) -> RetryPolicy | None:
    if (body.backoff_base_s, body.backoff_cap_s, body.non_retryable_codes) == (None,) * 3:
        return None
    return RetryPolicy.checked(body.backoff_base_s, body.backoff_cap_s,
                               body.non_retryable_codes)


def new_run(body: RunCreate, tenant: str, idempotency_key: str | None, *,
            input_parsed: bool = False, traceparent: str | None = None) -> NewRun:
    """The run a submit's body asks for (single, grouped, fast path or batch
    item); `input_parsed`, `traceparent`: see NewRun."""
    return NewRun(
        tenant, body.input, body.priority, body.max_attempts,
        None if body.budget is None else body.budget.model_dump(exclude_none=True),
        idempotency_key, body.labels, body.run_at, body.delay_s, body.pool,
        retry=retry_policy(body), input_parsed=input_parsed, traceparent=traceparent)


SUBMIT_403 = {"model": ErrorBody,
              "description": "`tenant_id` names another tenant than the token's, or an "
                             "admin token leaves it out."}


@router.post(
    "/runs", status_code=201, response_model=RunOut, dependencies=[JsonBody],
    responses={200: {"model": RunOut, "description": "The run this Idempotency-Key names."},
               403: SUBMIT_403,
               429: {"model": ErrorBody, "description": "Over the tenant's submit rate; "
                                                         "see Retry-After."},
               409: {"model": ErrorBody,
                     "description": "The key names another input's run; or `multitask: "
                                    "reject` and the thread has an unfinished run "
                                    "(`thread_busy`, its id in `active_run_id`)."},
               413: {"model": ErrorBody, "description": "Body over the bound."},
               415: {"model": ErrorBody,
                     "description": "No `Content-Type: application/json`."}},
)
async def submit(
    body: RunCreate, who: Who, store: Store, waker: Waker, groups: Groups,
    # The pattern the server checks (bounds.check_idempotency_key), stated in
    # the schema: no space or control character.
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1,
                                                  max_length=255,
                                                  pattern=r"^[^\x00-\x20\x7f]+$")] = None,
    traceparent: Annotated[str | None, Header(
        description="W3C trace context: the run's spans join this trace. A malformed "
                    "value is ignored.")] = None,
) -> Response:
    """Enqueue a run. The same Idempotency-Key again returns the same run (200).
    Over the tenant's submit rate in the pool: 429 with Retry-After."""
    tenant = tenant_for(body.tenant_id, who)
    idempotency_key = utf8_header(idempotency_key, "Idempotency-Key")
    parent = body.parent_run_id
    with tracing.submit_span(traceparent) as traced:
        if (parent is None and body.webhook_url is None and body.thread_id is None
                and body.concurrency_key is None and body.singleton is None
                and body.debounce is None):
            # Most submits: grouped (submit_group.py).
            result = await groups.submit(new_run(body, tenant, idempotency_key,
                                                 traceparent=traced.traceparent))
        else:
            result = await _submit_alone(body, who, tenant, store, idempotency_key,
                                         traced.traceparent)
        tracing.submitted(traced, result.run.id, inserted=result.inserted)
    return submitted(result, waker, admin=who.admin)


def utf8_header(value: str | None, name: str) -> str | None:
    """A header's text as the UTF-8 its bytes are: ASGI hands them over as
    Latin-1, which garbled a non-ASCII key (issue 32); not UTF-8: a 422."""
    if value is None or value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise ErrorAnswer(422, "invalid_request", f"{name}: must be UTF-8 text", name) from None


def submitted(result: EnqueueResult, waker: PoolWaker, *, admin: bool) -> Response:
    """A submit's answer (and its metric, and its pool's wakeup)."""
    run = result.run
    if result.inserted:
        metrics.RUNS_SUBMITTED.labels(run.pool).inc()
        if run.status == "pending" and run.available_at <= run.created_at:
            waker.wake((run.pool,))
    # Serialized here, once: returned as a model, it would be validated again.
    return Response(run_json(run, admin=admin), status_code=201 if result.inserted else 200,
                    media_type="application/json", headers={"Location": f"/v1/runs/{run.id}"})


async def _submit_alone(body: RunCreate, who: Principal, tenant: str, store: RunStore,
                        idempotency_key: str | None,
                        traceparent: str | None = None) -> EnqueueResult:
    """A submit with a parent, a webhook, a thread, a key, a singleton or a
    debounce: its checks share its
    transaction. A thread's interrupted run is stopped after the commit
    (db/threads.py says why)."""
    parent = body.parent_run_id
    interrupt = None
    async with submit_slot(store, body.pool, tenant) as conn:
        if parent is not None:
            await store.check_parent(parent, tenant, conn=conn, admin=who.admin)
        if body.webhook_url is not None:
            await store.check_webhook_url(body.webhook_url, conn=conn)
        run = new_run(body, tenant, idempotency_key, traceparent=traceparent)
        if body.thread_id is not None:
            joined = await store.submit_to_thread(body.pool, run, body.thread_id,
                                                  body.multitask or "enqueue", conn=conn)
            result, interrupt = joined.result, joined.interrupt
        elif body.singleton is not None:
            joined = await store.submit_singleton(body.pool, run, body.singleton.key,
                                                  body.singleton.on_conflict, conn=conn)
            result, interrupt = joined.result, joined.interrupt
        elif body.debounce is not None:
            result = await store.submit_debounced(
                body.pool, run, Debounce(body.debounce.key, body.debounce.window_s,
                                         body.debounce.max_delay_s), conn=conn)
        else:
            (result,) = await store.enqueue_many(body.pool, [run], notify=False, conn=conn)
            if body.concurrency_key is not None and result.inserted:
                result = EnqueueResult(
                    await store.join_key(result.run.id, body.concurrency_key, conn=conn), True)
        if parent is not None and result.inserted:
            result = EnqueueResult(await store.set_parent(result.run, parent, conn=conn), True)
        if body.webhook_url is not None and result.inserted:
            await store.add_webhook(result.run.id, tenant, body.webhook_url, conn=conn)
    if interrupt is not None:
        await store.interrupt(interrupt, tenant)
    return result


@router.get("/runs", response_model=RunPage,
            responses={403: {"model": ErrorBody,
                             "description": "`tenant` names another tenant than the "
                                            "token's."}})
async def list_runs(who: Who, store: Store, status: StatusQ = None, pool: PoolQ = None,
                    label: LabelQ = None, created_after: TimeQ = None,
                    created_before: TimeQ = None, finished_after: TimeQ = None,
                    finished_before: TimeQ = None, idempotency_key: KeyQ = None,
                    tenant: TenantQ = None, limit: Limit = 50,
                    cursor: UUID | None = None, parent_run_id: UUID | None = None,
                    id_prefix: IdPrefixQ = None, thread_id: ThreadQ = None) -> Response:
    """Runs, newest first, filtered (every filter given must match); pass
    `next_cursor` back as `cursor` for the next page (stable while runs are
    added: new runs never shift a page). `parent_run_id`: that run's children;
    `id_prefix`: the runs whose id starts with it; `thread_id`: a thread's runs
    (GET /v1/threads/{id}/runs lists them in submit order)."""
    f = run_filter(who, status=status, pool=pool, label=label, created_after=created_after,
                   created_before=created_before, finished_after=finished_after,
                   finished_before=finished_before, idempotency_key=idempotency_key,
                   tenant=tenant, parent_run_id=parent_run_id, id_prefix=id_prefix,
                   thread_id=thread_id)
    # The page's JSON text comes rendered from the database (db/run_json.py).
    return Response(await store.search_page(f, admin=who.admin, limit=limit, before=cursor),
                    media_type="application/json")


@router.get("/runs/{run_id}", response_model=RunOut)
async def get_run(run_id: UUID, who: Who, store: Store) -> RunOut:
    return RunOut.of(await store.get(run_id, tenant_id=who.scope), admin=who.admin)


STEP_PAGE_BYTES = 4 * 1024 * 1024
STREAM_TOKEN_PATTERN = r"^[A-Za-z0-9_=-]+\.[A-Za-z0-9_=-]+$"  # base64url body . signature
EVENT_SEQ_PATTERN = r"^[0-9]{1,18}$"  # fits a bigint


@router.get("/runs/{run_id}/steps", response_model=StepPage)
async def steps(
    run_id: UUID, who: Who, store: Store,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(min_length=1, max_length=255,
                                        pattern=r"^[^\x00]+$")] = None,
) -> StepPage:
    """The run's committed durable steps (what its tools returned, redacted),
    in step-key order; at most `limit` and about 4 MiB a page: pass
    `next_cursor` back as `cursor` for the next."""
    await store.get(run_id, tenant_id=who.scope)  # another tenant's run is a 404
    items, next_cursor = await store.steps_page(run_id, after=cursor, limit=limit,
                                                max_bytes=STEP_PAGE_BYTES)
    return StepPage(items=[StepOut.of(s) for s in items], next_cursor=next_cursor)


@router.post("/runs/{run_id}/cancel", status_code=202, response_model=RunOut,
             responses={409: {"model": ErrorBody,
                              "description": "The run is finished; the message says how."}})
async def cancel(run_id: UUID, who: Who, store: Store) -> RunOut:
    """Stop a run: a pending one is cancelled at once; a running one is stopped by
    its worker, tool processes included; its child runs (and theirs) are
    cancelled too. Closing an event stream never cancels anything; only this
    does. A finished run (done, dead, cancelled) is a 409."""
    run = await store.request_cancel(run_id, tenant_id=who.scope, strict=True)
    await store.cancel_descendants(run_id)  # its children, theirs...: the same tenant's
    return RunOut.of(run, admin=who.admin)


@router.post("/runs/{run_id}/stream-token", response_model=StreamToken)
async def stream_token(run_id: UUID, who: Who, store: Store, request: Request) -> StreamToken:
    """A short-lived token for this run's event stream only, for browsers
    (EventSource cannot send an Authorization header): pass it as `?token=`."""
    await store.get(run_id, tenant_id=who.scope)
    token, expires = api_state(request).stream_tokens.issue(run_id, who)
    return StreamToken(token=token, expires_at=expires,
                       url=f"/v1/runs/{run_id}/events?token={token}")


@router.get(
    "/runs/{run_id}/events", response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}},
                     "description": "Server-Sent Events: one per run event (id = its seq), "
                                    "keepalive comments, and a final `end` event."},
               429: {"model": ErrorBody,
                     "description": "The tenant holds sse_max_streams_per_tenant open "
                                    "streams on this server."}},
)
async def events(
    run_id: UUID, request: Request, store: Store,
    after: Annotated[int | None, Query(ge=0, le=10**18)] = None,
    token: Annotated[str | None, Query(min_length=1, max_length=512,
                                       pattern=STREAM_TOKEN_PATTERN)] = None,
    last_event_id: Annotated[str | None, Header(
        alias="Last-Event-ID", pattern=EVENT_SEQ_PATTERN,
        description="The seq of the last event seen (a decimal number).")] = None,
) -> StreamingResponse:
    """Replays stored events after Last-Event-ID (or `after`), then follows live
    ones; reconnecting with Last-Event-ID loses nothing and repeats nothing."""
    state = api_state(request)
    who = bearer(request)
    if who is None and token:
        who = state.stream_tokens.verify(token, run_id)
    if who is None:
        raise unauthorized("a bearer token or a stream token for this run is required")
    start = after or 0
    if last_event_id is not None:
        start = max(start, int(last_event_id))
    await store.get(run_id, tenant_id=who.scope)  # a 404 before the stream starts
    hub = state.opened().hub
    slot = None
    if who.scope is not None:  # admins are not capped
        slot = hub.admit(who.scope)
        if slot is None:
            raise ErrorAnswer(429, "too_many_streams",
                           f"this tenant already holds {hub.max_per_tenant} open event "
                           "streams on this server; close one first",
                           headers={"Retry-After": "5"})
    # Released when the stream ends, or by the response's background task
    # when the client left before the body began (the generator never ran).
    return StreamingResponse(_sse(hub, run_id, start, request, slot),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                             background=BackgroundTask(slot.release) if slot else None)


async def _sse(hub: FeedHub, run_id: UUID, after: int, request: Request,
               slot: StreamSlot | None = None) -> AsyncIterator[str]:
    metrics.SSE_STREAMS.inc()
    try:
        yield "retry: 1000\n\n"
        # A client that goes away cancels this generator (Starlette watches
        # for the disconnect); shutdown ends the hub's streams.
        async for item in hub.stream(run_id, after):
            if isinstance(item, Batch):
                yield item.text
            elif isinstance(item, Keepalive):
                yield ": keepalive\n\n"
            elif isinstance(item, End):
                yield format_end(item.run)
                return
    except RunNotFound:  # deleted by retention while followed
        return
    finally:
        metrics.SSE_STREAMS.dec()
        if slot is not None:
            slot.release()


def format_end(run: Run) -> str:
    # No id: the end is not an event of the run; Last-Event-ID stays the last seq.
    data: dict[str, Any] = {"status": run.status.value, "error_code": run.error_code,
                            "attempts": run.attempts}
    return f"event: end\ndata: {json.dumps(data)}\n\n"


# -- operations (admin) ---------------------------------------------------------------------


@router.get("/dead-letters", response_model=RunPage)
async def dead_letters(who: Admin, store: Store, pool: PoolName = None, limit: Limit = 50,
                       cursor: UUID | None = None) -> Response:
    """Runs that ended dead, newest first (admin)."""
    runs = await store.list_runs(pool=pool, status=RunStatus.DEAD, limit=limit, before=cursor)
    return page(runs, limit, admin=True)


@router.post("/runs/{run_id}/redrive", response_model=RunOut,
             responses={409: {"model": ErrorBody, "description": "The run is not dead."}})
async def redrive(run_id: UUID, who: Admin, store: Store) -> RunOut:
    """Send a dead run back to pending with its attempts reset (admin)."""
    return RunOut.of(await store.redrive(run_id), admin=True)


@router.get("/pools", response_model=list[PoolOut])
async def pools(who: Admin, store: Store) -> list[PoolOut]:
    """Pools and their tenant limits (admin)."""
    return [PoolOut.of(p, await store.tenant_settings(p.name), await store.queue_quotas(p.name))
            for p in await store.list_pools()]


@router.get("/pools/{pool_name}", response_model=PoolOut,
            responses={404: {"model": ErrorBody, "description": "No such pool."}})
async def get_pool(
    pool_name: PoolPath,
    who: Admin, store: Store,
) -> PoolOut:
    """One pool and its tenant settings (admin)."""
    pool = await store.get_pool(pool_name)
    if pool is None:
        raise HTTPException(404, f"no pool {pool_name!r}")
    return PoolOut.of(pool, await store.tenant_settings(pool_name),
                      await store.queue_quotas(pool_name))


@router.put("/pools/{pool_name}", response_model=PoolOut, dependencies=[JsonBody],
            responses={415: {"model": ErrorBody,
                             "description": "No `Content-Type: application/json`."}})
async def put_pool(
    pool_name: PoolPath,
    body: PoolIn, who: Admin, store: Store,
) -> PoolOut:
    """Create or update a pool: every setting as given (left out: its default);
    its tenant limits, priority bands and rates become exactly those given
    (admin)."""
    async with store.connection() as conn, conn.transaction():
        pool = await store.put_pool(Pool(pool_name, body.max_attempts, body.lease_s,
                                         body.default_max_in_flight, body.priority_aging_s,
                                         body.retention_s, body.paused, tuple(body.tool_env)),
                                    body.tenants(), conn=conn)
        await store.set_queue_quotas(pool_name, body.default_max_pending,
                                     body.tenant_max_pending, conn=conn)
    return PoolOut.of(pool, await store.tenant_settings(pool_name),
                      await store.queue_quotas(pool_name))
