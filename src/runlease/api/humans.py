"""People and runs (issue 28): answer a run waiting for input, send it
messages, follow a resume link.

    GET  /v1/runs/{id}/input      what the run asked, open requests with a resume link
    POST /v1/runs/{id}/input      {name, value}: answer one request (once)
    POST /v1/runs/{id}/messages   {text, data?}: into the run's inbox
    GET  /v1/runs/{id}/messages   the inbox, each message with whether it was taken
    GET  /v1/resume/{token}       a page with the prompt and a form (no token needed)
    POST /v1/resume/{token}       the answer from that page, or JSON {value}
    POST /v1/runs/{id}/rerun      {from_step?, input?}: a new run, earlier steps copied
    POST /v1/runs/rerun           {ids, from_step?}: admin, many at once

A tenant reaches its own runs only (another tenant's is a 404). A resume
link is the only credential its page needs, names one request, expires, and
answers once (api/resume_links.py).
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field, model_validator

from runlease.api.actions_schemas import RunFilterIn
from runlease.api.deps import Admin, JsonBody, Store, Waker, Who, api_state
from runlease.api.errors import ErrorAnswer
from runlease.api.rates import submit_slot
from runlease.api.resume_links import MAX_LINK_S, MAX_TOKEN_CHARS, LinkRefused, ResumeLinks
from runlease.api.schemas import ErrorBody, RunOut
from runlease.api.search import run_filter
from runlease.core.states import RunStatus
from runlease.db.humans import (
    MAX_MESSAGE_BYTES,
    MAX_MESSAGES_PAGE,
    InboxFull,
    InputRefused,
    InputRequest,
    MessageRefused,
    free_text,
)
from runlease.db.store import RunStore
from runlease.errors import RunNotFound, ValidationError

router = APIRouter(prefix="/v1")

MAX_FORM_BYTES = 64 * 1024


class InputAnswer(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                      description="The name the agent gave ctx.wait_for_input.")
    value: Any = Field(description="The answer: JSON, checked against the request's schema.")


class InputAnswered(BaseModel):
    resumed: bool = Field(description="True when this call resumed the run; false when the "
                                      "same answer had been applied before (a repeat).")
    run: RunOut


class InputRequestOut(BaseModel):
    name: str
    prompt: str | None
    schema_: Any = Field(None, alias="schema", serialization_alias="schema")
    requested_at: datetime
    timeout_at: datetime | None
    open: bool = Field(description="The run waits for this answer now.")
    outcome: str | None = Field(description="answered, timed_out, closed (the run ended "
                                            "first), or null while open.")
    answered_at: datetime | None
    answered_by: str | None = Field(description="api, url, message or timeout.")
    value: Any = None
    resume_url: str | None = Field(None, description="Open requests only: a single-use "
                                                     "link that answers without a token.")


class InputRequests(BaseModel):
    items: list[InputRequestOut]


class MessageIn(BaseModel):
    text: str = Field(max_length=MAX_MESSAGE_BYTES, description="What the agent is told.")
    data: dict[str, Any] | None = Field(None, description="Anything else, as JSON.")


class MessageSent(BaseModel):
    run_id: UUID
    seq: int | None = Field(description="The message's place in the run's inbox; null when "
                                        "it answered the run's open request instead.")
    answered_input: str | None = Field(None, description="The request for free text this "
                                                         "message answered (the run was "
                                                         "waiting for it).")
    status: str


class MessageOut(BaseModel):
    seq: int
    text: str
    data: dict[str, Any] | None = None
    sent_at: datetime
    taken: bool = Field(description="The agent has taken it.")


class MessagePage(BaseModel):
    items: list[MessageOut]


NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such run of this tenant."}}
NEEDS_JSON: dict[int | str, dict[str, Any]] = {
    415: {"model": ErrorBody, "description": "No `Content-Type: application/json`."}}
HTML = {"text/html": {"schema": {"type": "string"}}}
PAGES: dict[int | str, dict[str, Any]] = {
    200: {"content": HTML, "description": "The page."},
    404: {"content": HTML, "description": "Not a resume link (forged, malformed), or its "
                                          "request is gone."},
    409: {"content": HTML, "description": "The request was answered already, or timed out."},
    410: {"content": HTML, "description": "The link expired, or its request is closed."},
    422: {"content": {**HTML, "application/json": {"schema": {"$ref": "#/components/schemas/"
                                                                        "ErrorBody"}}},
          "description": "A token too long to be a link (JSON), or an answer the request's "
                         "schema refuses (the page again)."},
    413: {"content": HTML, "description": "An answer over 64 KiB."},
}


def _refused(exc: InputRefused) -> ErrorAnswer:
    return ErrorAnswer(409, "input_refused", str(exc), "name")


async def _links(request: Request, store: RunStore) -> ResumeLinks:
    state = api_state(request)
    if state.resume_links is None:
        key = state.settings.resume_secret or await store.server_key("resume")
        state.resume_links = ResumeLinks(key)
    links: ResumeLinks = state.resume_links
    return links


def _now(store: RunStore) -> datetime:
    return store.clock.db_now() or datetime.now(UTC)


def _base(request: Request) -> str:
    public = api_state(request).settings.public_url
    return (public or str(request.base_url)).rstrip("/")


def _link(request: Request, links: ResumeLinks, req: InputRequest, now: datetime) -> str:
    expires = int(now.timestamp()) + MAX_LINK_S
    if req.timeout_at is not None:
        expires = min(expires, int(req.timeout_at.timestamp()))
    return f"{_base(request)}/v1/resume/{links.issue(req.run_id, req.name, req.nonce, expires)}"


@router.get("/runs/{run_id}/input", response_model=InputRequests, responses=NOT_FOUND,
            response_model_by_alias=True)
async def input_requests(run_id: UUID, who: Who, store: Store,
                         request: Request) -> InputRequests:
    """What the run asked people, oldest first: each request's prompt and
    schema, and its outcome; an open one carries a single-use resume link."""
    run = await store.get(run_id, tenant_id=who.scope)
    found = await store.input_requests(run.id, tenant_id=who.scope)
    links = await _links(request, store) if any(r.open for r in found) else None
    now = _now(store)
    items = []
    for r in found:
        out = InputRequestOut.model_validate({**r.to_json(), "resume_url": (
            _link(request, links, r, now) if r.open and links is not None else None)})
        items.append(out)
    return InputRequests(items=items)


@router.post("/runs/{run_id}/input", response_model=InputAnswered, dependencies=[JsonBody],
             responses={**NOT_FOUND, **NEEDS_JSON, 409: {"model": ErrorBody, "description": (
                 "The run is not waiting for that name, or it was answered with another "
                 "value, or it timed out.")}})
async def give_input(run_id: UUID, body: InputAnswer, who: Who, store: Store) -> InputAnswered:
    """Answer a run waiting for input: it goes back to pending, and its agent
    goes on from the wait with this value. Checked against the request's
    schema (422). Idempotent: the same answer again is answered as applied
    (`resumed` false); another answer is a 409."""
    try:
        resumed = await store.give_input(run_id, body.name, body.value, tenant_id=who.scope)
    except InputRefused as exc:
        raise _refused(exc) from None
    run = await store.get(run_id, tenant_id=who.scope)
    return InputAnswered(resumed=resumed, run=RunOut.of(run, admin=who.admin))


@router.post("/runs/{run_id}/messages", status_code=202, response_model=MessageSent,
             dependencies=[JsonBody],
             responses={**NOT_FOUND, **NEEDS_JSON,
                        409: {"model": ErrorBody, "description": "The run is finished."},
                        429: {"model": ErrorBody, "description": (
                            "The inbox is full: the agent has not taken the messages "
                            "before (Retry-After), or the run had its share.")}})
async def send_message(run_id: UUID, body: MessageIn, who: Who, store: Store) -> MessageSent:
    """Send the run a message: its agent gets it at its next turn
    (ctx.receive, ctx.take_messages), once. A run waiting for free-text
    input (no schema, or a string) takes the message as that answer and
    resumes: that is how a chat continues a paused run."""
    tenant = who.scope
    run = await store.get(run_id, tenant_id=tenant)
    if run.status == RunStatus.WAITING:
        for req in await store.input_requests(run_id, tenant_id=tenant):
            if req.open and free_text(req.schema):
                try:
                    await store.give_input(run_id, req.name, body.text, tenant_id=tenant,
                                           by="message")
                except InputRefused:
                    break  # answered or ended meanwhile: the message goes to the inbox
                except ValidationError:
                    break  # too long for the request's maxLength: to the inbox
                return MessageSent(run_id=run_id, seq=None, answered_input=req.name,
                                   status=RunStatus.PENDING.value)
    try:
        seq, status = await store.send_message(run_id, body.text, body.data, tenant_id=tenant)
    except MessageRefused as exc:
        raise ErrorAnswer(409, "run_finished", str(exc)) from None
    except InboxFull as exc:
        raise ErrorAnswer(429, "inbox_full", str(exc),
                          headers={"Retry-After": str(int(exc.retry_s))}) from None
    return MessageSent(run_id=run_id, seq=seq, answered_input=None, status=status)


@router.get("/runs/{run_id}/messages", response_model=MessagePage, responses=NOT_FOUND)
async def messages(run_id: UUID, who: Who, store: Store,
                   after: Annotated[int, Query(ge=0)] = 0,
                   limit: Annotated[int, Query(ge=1, le=MAX_MESSAGES_PAGE)] = 100,
                   ) -> MessagePage:
    """The run's inbox after seq `after`, oldest first."""
    await store.get(run_id, tenant_id=who.scope)
    found = await store.messages(run_id, tenant_id=who.scope, after=after, limit=limit)
    return MessagePage(items=[MessageOut.model_validate(m) for m in found])


# -- resume links: for people without a token ------------------------------------------

TokenPath = Annotated[str, Path(min_length=1, max_length=MAX_TOKEN_CHARS)]


async def _target(token: str, request: Request, store: RunStore) -> tuple[Any, InputRequest]:
    links = await _links(request, store)
    try:
        target = links.verify(token, _now(store).timestamp())
    except LinkRefused as exc:
        raise ErrorAnswer(410 if "expired" in str(exc) else 404, "link_refused",
                          str(exc)) from None
    try:
        found = await store.input_requests(target.run_id)
    except RunNotFound:
        found = []
    for req in found:
        if req.name == target.name and req.nonce == target.nonce:
            return target, req
    raise ErrorAnswer(404, "link_refused", "this link's request no longer exists")


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        "<meta name=referrer content=no-referrer>"
        f"<title>{html.escape(title)}</title><style>body{{font:16px system-ui,sans-serif;"
        "max-width:40rem;margin:3rem auto;padding:0 1rem}}pre{{white-space:pre-wrap;"
        "background:#f4f4f5;padding:1rem;border-radius:.5rem}}button{{font-size:1rem;"
        "padding:.5rem 1.5rem;margin-right:.5rem}}textarea{{width:100%;min-height:6rem}}"
        f"</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>",
        status_code=status, headers={"Cache-Control": "no-store",
                                     "Content-Security-Policy": "default-src 'none'; "
                                     "style-src 'unsafe-inline'; form-action 'self'"})


def _form(req: InputRequest) -> str:
    prompt = f"<pre>{html.escape(req.prompt)}</pre>" if req.prompt else ""
    schema = req.schema if isinstance(req.schema, dict) else {}
    if schema.get("type") == "boolean":
        controls = ("<button name=value value=true>Approve</button>"
                    "<button name=value value=false>Deny</button>")
    elif free_text(req.schema):
        controls = "<textarea name=value required></textarea><button>Send</button>"
    else:
        controls = ("<p>Your answer, as JSON:</p><textarea name=value required></textarea>"
                    f"<pre>{html.escape(json.dumps(req.schema, indent=2)[:4000])}</pre>"
                    "<button>Send</button>")
    return f"{prompt}<form method=post>{controls}</form>"


@router.get("/resume/{token}", response_class=HTMLResponse, responses=PAGES)
async def resume_page(token: TokenPath, request: Request, store: Store) -> Response:
    """The page a resume link opens: the run's prompt and a form (approve and
    deny buttons for a yes/no question). Opening it changes nothing (link
    previews fetch it); the form's POST answers."""
    try:
        _, req = await _target(token, request, store)
    except ErrorAnswer as exc:
        return _page("This link cannot be used", f"<p>{html.escape(exc.message)}.</p>",
                     exc.status)
    if not req.open:
        return _page("Already answered", "<p>This request has been answered, or the run "
                                         "has moved on. Nothing more to do.</p>", 410)
    return _page(f"Input requested: {req.name}", _form(req))


@router.post("/resume/{token}", response_class=HTMLResponse, responses={
    **PAGES, 200: {"content": {**HTML, "application/json": {"schema": {"type": "object"}}},
                   "description": "Answered: a page, or JSON for a JSON request."}})
async def resume(token: TokenPath, request: Request, store: Store) -> Response:
    """Answer through a resume link: the page's form, or JSON {"value": ...}.
    Works once."""
    wants_json = request.headers.get("content-type", "").startswith("application/json")
    try:
        target, req = await _target(token, request, store)
        value = await _value(request, req, wants_json)
        await store.give_input(target.run_id, target.name, value, by="url", nonce=target.nonce)
    except ErrorAnswer as exc:
        if wants_json:
            raise
        return _page("This link cannot be used", f"<p>{html.escape(exc.message)}.</p>",
                     exc.status)
    except InputRefused as exc:
        if wants_json:
            raise _refused(exc) from None
        return _page("Already answered", f"<p>{html.escape(exc.why)}.</p>", 409)
    except ValidationError as exc:
        if wants_json:
            raise
        return _page("Not accepted", f"<p>{html.escape(str(exc))}</p>{_form(req)}", 422)
    if wants_json:
        return JSONResponse({"resumed": True, "run_id": str(target.run_id),
                             "name": target.name})
    return _page("Thank you", "<p>Your answer was sent; the run goes on.</p>")


async def _value(request: Request, req: InputRequest, wants_json: bool) -> Any:
    raw = await request.body()
    if len(raw) > MAX_FORM_BYTES:
        raise ErrorAnswer(413, "too_large", f"an answer is at most {MAX_FORM_BYTES} bytes")
    if wants_json:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ErrorAnswer(422, "invalid_request", "body: not valid JSON", "body") from None
        if not isinstance(body, dict) or "value" not in body:
            raise ErrorAnswer(422, "invalid_request", "body: send {\"value\": ...}", "value")
        return body["value"]
    from urllib.parse import parse_qs
    try:
        fields = parse_qs(raw.decode(), max_num_fields=4)
    except (ValueError, UnicodeDecodeError):
        raise ErrorAnswer(422, "invalid_request", "the form could not be read") from None
    text = (fields.get("value") or [""])[0]
    schema = req.schema if isinstance(req.schema, dict) else {}
    if schema.get("type") == "boolean":
        if text not in ("true", "false"):
            raise ErrorAnswer(422, "invalid_request", "choose approve or deny", "value")
        return text == "true"
    if free_text(req.schema):
        return text
    try:
        return json.loads(text)
    except ValueError:
        raise ValidationError("value", "is not valid JSON") from None


# -- reruns ------------------------------------------------------------------------------

MAX_BULK_RERUN = 100


class RerunIn(BaseModel):
    from_step: str | None = Field(
        None, min_length=1, max_length=255,
        description="Copy the steps the run committed before this one (all of them when it "
                    "never committed: the step that failed); none when left out.")
    input: dict[str, Any] | None = Field(None, description="A new input (default: the run's).")


class RerunOut(BaseModel):
    run: RunOut
    rerun_of: UUID
    steps_copied: int


class BulkRerunIn(BaseModel):
    ids: list[UUID] | None = Field(None, min_length=1, max_length=MAX_BULK_RERUN)
    filter: RunFilterIn | None = Field(None, description="The runs list's filter: the "
                                                         "newest 100 runs it matches.")
    from_step: str | None = Field(None, min_length=1, max_length=255)

    @model_validator(mode="after")
    def _one_way(self) -> BulkRerunIn:
        if (self.ids is None) == (self.filter is None):
            raise ValueError("give ids or filter, one of them")
        return self


class BulkRerunOut(BaseModel):
    items: list[RerunOut]


@router.post("/runs/{run_id}/rerun", status_code=201, response_model=RerunOut,
             dependencies=[JsonBody], responses={**NOT_FOUND, **NEEDS_JSON, 429: {
                 "model": ErrorBody, "description": "Over the tenant's submit rate."}})
async def rerun(run_id: UUID, body: RerunIn, who: Who, store: Store, waker: Waker) -> RerunOut:
    """Run a run again as a new run (same tenant, pool and thread; a new
    input if given), linked by `rerun_of`. With `from_step`, the steps it
    committed before that step are copied as committed: the new run's agent
    replays them instead of running them (a two-hour run's last tool call,
    retried without the first hour). Counts as a submit of the tenant."""
    old = await store.get(run_id, tenant_id=who.scope)
    async with submit_slot(store, old.pool, old.tenant_id) as conn:
        run, copied = await store.rerun(run_id, tenant_id=who.scope, from_step=body.from_step,
                                        input=body.input, conn=conn)
    waker.wake((run.pool,))
    return RerunOut(run=RunOut.of(run, admin=who.admin), rerun_of=run_id, steps_copied=copied)


@router.post("/runs/rerun", status_code=201, response_model=BulkRerunOut,
             dependencies=[JsonBody], responses={**NOT_FOUND, **NEEDS_JSON})
async def bulk_rerun(body: BulkRerunIn, who: Admin, store: Store, waker: Waker) -> BulkRerunOut:
    """Rerun many runs at once (admin): by ids (at most 100) or by the runs
    list's filter (its newest 100 matches), each as its own rerun, from the
    same step. An id of no run is a 404; nothing is rerun then."""
    items: list[RerunOut] = []
    ids = body.ids
    if (f := body.filter) is not None:
        where = run_filter(who, status=f.status, pool=f.pool, label=f.label,
                           created_after=f.created_after, created_before=f.created_before,
                           finished_after=f.finished_after, finished_before=f.finished_before,
                           tenant=f.tenant_id)
        ids = [r.id for r in await store.search(where, limit=MAX_BULK_RERUN)]
    async with store.connection() as conn, conn.transaction():
        for run_id in dict.fromkeys(ids or []):
            run, copied = await store.rerun(run_id, from_step=body.from_step, conn=conn)
            items.append(RerunOut(run=RunOut.of(run, admin=True), rerun_of=run_id,
                                  steps_copied=copied))
    waker.wake(tuple({i.run.pool for i in items}))
    return BulkRerunOut(items=items)
