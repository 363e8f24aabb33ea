"""Console pages for runs: sign in and out, the live runs table, one run
(with its live event stream), and its Cancel, Redrive, Rerun and input forms."""

from __future__ import annotations

import contextlib
import json
import math
import re
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from runlease.api.console.attempts import attempts
from runlease.api.console.deps import (
    AdminForm,
    BadRequest,
    Form,
    Refused,
    Store,
    Who,
    console_state,
    form_fields,
    same_origin,
    scoped_run,
)
from runlease.api.console.filters import STATUSES, Filters
from runlease.api.console.session import COOKIE, COOKIE_PATH
from runlease.api.deps import api_state
from runlease.core.states import RunStatus
from runlease.db.humans import InputRefused, free_text
from runlease.db.models import Run
from runlease.db.rates import Throttled
from runlease.db.run_search import RunFilter
from runlease.db.store import RunStore
from runlease.errors import InvalidTransition, RunNotFound, ValidationError

router = APIRouter(prefix="/ui", include_in_schema=False)

PAGE_SIZE = 50
STEPS_SHOWN = 20
STEPS_MAX_BYTES = 256 * 1024  # the steps' fragment is polled while the run runs
FINISHED = (RunStatus.DONE, RunStatus.DEAD, RunStatus.CANCELLED)
NOTICES = {
    "cancel": "Cancel requested: a pending run ends now, a running one when its worker stops it.",
    "redrive": "Redriven: the run is pending again, its attempts reset.",
    "cancel-finished": "The run had already finished: nothing to cancel.",
    "redrive-not-dead": "Only a dead run can be redriven.",
    "input": "Answered: the run goes on with your answer.",
    "input-refused": "That request cannot be answered any more (answered, timed out, or the "
                     "run moved on).",
    "rerun": "This run is a rerun: the steps copied from the old run are not run again.",
}


def see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


@router.get("/")
async def home(request: Request, who: Who) -> Response:
    return see_other("/ui/runs")


@router.get("/login")
async def login_page(request: Request) -> Response:
    return console_state(request).renderer.page(request, "login.html", {"error": None})


@router.post("/login")
async def login(request: Request) -> Response:
    state = console_state(request)
    if not same_origin(request):
        return state.renderer.page(request, "login.html",
                                   {"error": "This form came from another site."}, 403)
    client = request.client.host if request.client else ""
    wait_s = state.throttle.wait_s(client)
    if wait_s:  # too many wrong tokens from here lately (console/throttle.py)
        retry = max(1, math.ceil(wait_s))
        throttled = state.renderer.page(request, "login.html", {
            "error": f"Too many failed sign-ins: try again in {retry} s."}, 429)
        throttled.headers["Retry-After"] = str(retry)
        return throttled
    fields = await form_fields(request)
    token = (fields.get("token") or [""])[0].strip()
    tokens = api_state(request).tokens
    who = tokens.authenticate(token) if token else None
    if who is None:
        state.throttle.failed(client)
        return state.renderer.page(request, "login.html",
                                   {"error": "Unknown token: give a tenant or admin token."},
                                   401)
    cookie, _ = state.sessions.issue(who, state.sessions.token_id(tokens.digest_of(token)))
    response = see_other("/ui/runs")
    response.set_cookie(COOKIE, cookie, max_age=state.sessions.ttl_s, path=COOKIE_PATH,
                        httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return response


@router.post("/logout")
async def logout(request: Request, form: Form) -> Response:
    # The cookie is signed, not stored: it is dead only once its nonce is
    # recorded as signed out (a copy kept elsewhere would still work).
    session = form.viewer.session
    await api_state(request).opened().store.sign_out(session.nonce, session.expires)
    response = see_other("/ui/login")
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
    return response


ID_PREFIX = re.compile(r"(?=(?:[0-9a-f]-?){8})[0-9a-f-]{8,35}")


async def find_runs(store: RunStore, f: Filters, scope: str | None) -> list[Run]:
    tenant = f.tenant or scope
    if f.q:
        try:
            run_id = UUID(f.q)
        except ValueError:
            if ID_PREFIX.fullmatch(f.q):
                # The start of an id, as the CLI and the demo print them.
                with contextlib.suppress(ValidationError):
                    found = await store.search(RunFilter(tenant_id=tenant, id_prefix=f.q),
                                               limit=PAGE_SIZE)
                    if found:
                        return found
            try:
                return await store.runs_by_key(f.q, tenant_id=tenant, limit=PAGE_SIZE)
            except ValidationError as exc:
                raise BadRequest(f"search: {exc.message}") from None
        try:
            return [await store.get(run_id, tenant_id=tenant)]
        except RunNotFound:
            return []
    return await store.search(f.run_filter, limit=PAGE_SIZE,
                              before=UUID(f.cursor) if f.cursor else None)


async def runs_context(request: Request, who: Who, store: RunStore) -> dict[str, Any]:
    f = Filters.parse(request, who.admin, who.scope)
    runs = await find_runs(store, f, who.scope)
    # Over every run of the viewer's scope (tenant, pool), whatever else filters the table.
    counts = await store.status_counts(tenant_id=f.tenant or who.scope, pool=f.pool or None)
    return {"viewer": who, "f": f, "runs": runs, "counts": counts, "statuses": STATUSES,
            "live": not f.cursor, "next_query": f.query(cursor=str(runs[-1].id))
            if len(runs) == PAGE_SIZE and not f.q else None}


@router.get("/runs")
async def runs_page(request: Request, who: Who, store: Store) -> Response:
    context = await runs_context(request, who, store)
    return console_state(request).renderer.page(request, "runs.html", context)


@router.get("/runs/table")
async def runs_table(request: Request, who: Who, store: Store) -> Response:
    context = await runs_context(request, who, store)
    return console_state(request).renderer.page(request, "_runs_table.html", context)


async def run_context(request: Request, run_id: UUID, who: Who,
                      store: RunStore) -> dict[str, Any]:
    run = await scoped_run(store, run_id, who)
    notice = NOTICES.get(request.query_params.get("notice", ""))
    lifecycle = await store.lifecycle(run_id)
    inputs = (await store.input_requests(run_id, tenant_id=who.scope)
              if run.status == RunStatus.WAITING else [])
    # Its thread's neighbours: the two runs before it and the two after.
    neighbours = (await store.thread_runs(run.tenant_id, run.thread_id,
                                          after=max(0, (run.thread_seq or 0) - 3), limit=5)
                  if run.thread_id is not None else [])
    return {"viewer": who, "run": run, "notice": notice, "lifecycle": lifecycle,
            "attempts": attempts(run, await store.holders(run_id), lifecycle),
            "finished": run.status in FINISHED, "neighbours": neighbours,
            "inputs": [i for i in inputs if i.open], "input_error": None}


async def steps_context(store: RunStore, run_id: UUID) -> dict[str, Any]:
    steps, more = await store.steps_page(run_id, limit=STEPS_SHOWN, max_bytes=STEPS_MAX_BYTES)
    return {"steps": steps, "more_steps": more is not None}


@router.get("/runs/{run_id}")
async def run_page(request: Request, run_id: UUID, who: Who, store: Store) -> Response:
    context = await run_context(request, run_id, who, store)
    token, _ = api_state(request).stream_tokens.issue(run_id, who.session.principal)
    context |= await steps_context(store, run_id)
    context["stream_url"] = f"/v1/runs/{run_id}/events?token={token}"
    return console_state(request).renderer.page(request, "run.html", context)


@router.get("/runs/{run_id}/steps")
async def run_steps(request: Request, run_id: UUID, who: Who, store: Store) -> Response:
    run = await scoped_run(store, run_id, who)
    context = {"run": run, "finished": run.status in FINISHED} | await steps_context(store, run_id)
    return console_state(request).renderer.page(request, "_run_steps.html", context)


@router.get("/runs/{run_id}/summary")
async def run_summary(request: Request, run_id: UUID, who: Who, store: Store) -> Response:
    context = await run_context(request, run_id, who, store)
    return console_state(request).renderer.page(request, "_run_summary.html", context)


@router.get("/runs/{run_id}/stream-url")
async def stream_url(request: Request, run_id: UUID, who: Who, store: Store) -> Response:
    """A fresh stream token, for an event stream that outlived its last one."""
    await scoped_run(store, run_id, who)
    token, _ = api_state(request).stream_tokens.issue(run_id, who.session.principal)
    return JSONResponse({"url": f"/v1/runs/{run_id}/events?token={token}"},
                        headers={"Cache-Control": "no-store"})


@router.post("/runs/{run_id}/cancel")
async def cancel(run_id: UUID, form: Form, store: Store) -> Response:
    await scoped_run(store, run_id, form.viewer)
    try:
        await store.request_cancel(run_id, tenant_id=form.viewer.scope, strict=True)
    except InvalidTransition:
        return see_other(f"/ui/runs/{run_id}?notice=cancel-finished")
    return see_other(f"/ui/runs/{run_id}?notice=cancel")


@router.post("/runs/{run_id}/redrive")
async def redrive(run_id: UUID, form: AdminForm, store: Store) -> Response:
    await scoped_run(store, run_id, form.viewer)
    try:
        await store.redrive(run_id)
    except InvalidTransition:
        return see_other(f"/ui/runs/{run_id}?notice=redrive-not-dead")
    return see_other(f"/ui/runs/{run_id}?notice=redrive")


@router.post("/runs/{run_id}/input")
async def give_input(request: Request, run_id: UUID, form: Form, store: Store) -> Response:
    """The waiting run's form: approve, deny, or a value (text, or JSON for
    a request with a schema that is not text)."""
    await scoped_run(store, run_id, form.viewer)
    name = form.get("name")
    requests = {r.name: r for r in await store.input_requests(run_id,
                                                              tenant_id=form.viewer.scope)}
    request_ = requests.get(name)
    if request_ is None or not request_.open:
        return see_other(f"/ui/runs/{run_id}?notice=input-refused")
    text = form.get("value")
    try:
        value = console_value(request_.schema, text)
        await store.give_input(run_id, name, value, tenant_id=form.viewer.scope, by="console")
    except InputRefused:
        return see_other(f"/ui/runs/{run_id}?notice=input-refused")
    except ValidationError as exc:
        context = await run_context(request, run_id, form.viewer, store)
        context |= await steps_context(store, run_id)
        context["input_error"] = str(exc)
        token, _ = api_state(request).stream_tokens.issue(run_id, form.viewer.session.principal)
        context["stream_url"] = f"/v1/runs/{run_id}/events?token={token}"
        return console_state(request).renderer.page(request, "run.html", context,
                                                   status=422)
    return see_other(f"/ui/runs/{run_id}?notice=input")


def console_value(schema: Any, text: str) -> Any:
    """A form's text as the request's kind of answer."""
    if isinstance(schema, dict) and schema.get("type") == "boolean":
        if text not in ("true", "false"):
            raise ValidationError("value", "choose approve or deny")
        return text == "true"
    if free_text(schema):
        return text
    try:
        return json.loads(text)
    except ValueError:
        raise ValidationError("value", "is not valid JSON") from None


@router.post("/runs/{run_id}/rerun")
async def rerun(run_id: UUID, form: Form, store: Store) -> Response:
    """Run it again: from the step named in the form (the steps committed
    before it copied), or from scratch."""
    old = await scoped_run(store, run_id, form.viewer)
    from_step = form.get("from_step").strip() or None
    try:
        async with store.connection() as conn, conn.transaction():
            await store.admit_all(old.pool, old.tenant_id, 1, conn=conn)
            run, _ = await store.rerun(run_id, tenant_id=form.viewer.scope,
                                       from_step=from_step, conn=conn)
    except (Throttled, ValidationError) as exc:
        raise Refused(429 if isinstance(exc, Throttled) else 422, str(exc)) from None
    return see_other(f"/ui/runs/{run.id}?notice=rerun")
