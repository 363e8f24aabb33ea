"""POST /v1/runs answered without FastAPI's routing and dependency layers,
for the plainly well-formed submit; anything else goes to the app unchanged.

Routing, dependency solving and the exception layers cost a submit about as
much CPU as the submit's own work (docs/benchmarks.md: 0.85 ms of API CPU a
submit with them, about 0.5 without). This ASGI middleware sits inside the
app's own (body bound, metrics, CORS) and answers a submit itself only when
nothing about it could differ from the route's answer: a known bearer
token, a JSON content type, at most one Idempotency-Key within its bounds, a
body that the route's model accepts (parsed as FastAPI parses it), a tenant
the token may submit for, and no parent, webhook, thread, key, singleton or
debounce. Every other request, malformed or not, is passed on with its
body, and the route answers it.
Errors of the submit itself (rate, idempotency conflict, unknown pool, bad
input) are rendered by the app's own exception handlers.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from fastapi import FastAPI, Request
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runlease import tracing
from runlease.api.deps import ApiState, principal_of
from runlease.api.routes import new_run, router, submitted, tenant_for
from runlease.api.schemas import RunCreate

PATH = "/v1/runs"
KEY_MAX_CHARS = 255  # as the route's Idempotency-Key header


def _json_media(value: bytes) -> bool:
    # deps.json_content's rule.
    media = value.decode("latin-1").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


def _headers(scope: Scope) -> tuple[str, str | None, str | None] | None:
    """The Authorization header, the Idempotency-Key and the traceparent,
    when the route would read them as these: each at most once, a JSON
    content type, the key within its bounds. None: leave the request to the
    route."""
    found: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in (b"authorization", b"content-type", b"idempotency-key", b"traceparent"):
            if name in found:
                return None
            found[name] = value
    if b"authorization" not in found or not _json_media(found.get(b"content-type", b"")):
        return None
    key = found.get(b"idempotency-key")
    try:  # the key's bytes as UTF-8, as the route reads them (issue 32: garbled)
        idempotency_key = None if key is None else key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= KEY_MAX_CHARS:
        return None
    traceparent = found.get(b"traceparent")
    return (found[b"authorization"].decode("latin-1"), idempotency_key,
            None if traceparent is None else traceparent.decode("latin-1"))


class FastSubmit:
    path = PATH

    def __init__(self, app: ASGIApp, api: FastAPI, state: ApiState) -> None:
        self.app = app
        self.api = api
        self.state = state
        self.route: BaseRoute | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        raw, complete = await self._body(receive)
        handled = complete and await self._submit(scope, raw, receive, send)
        if handled:
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": not complete}

        await self.app(scope, replay, send)

    @staticmethod
    async def _body(receive: Receive) -> tuple[bytes, bool]:
        """The body (bounded by BodyLimit outside), and whether all of it came."""
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks), False
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks), True

    async def _submit(self, scope: Scope, raw: bytes, receive: Receive, send: Send) -> bool:
        """Answers the submit and returns True, or returns False having sent nothing."""
        state = self.state
        live = state.live
        if live is None:
            return False
        headers = _headers(scope)
        if headers is None:
            return False
        auth, idempotency_key, traceparent = headers
        who = principal_of(state, auth)
        if who is None:
            return False
        try:  # as FastAPI reads a body: json.loads, then the model in Python mode
            body = RunCreate.model_validate(json.loads(raw))
            if (body.parent_run_id is not None or body.webhook_url is not None
                    or body.thread_id is not None or body.concurrency_key is not None
                    or body.singleton is not None or body.debounce is not None):
                return False
            run = new_run(body, tenant_for(body.tenant_id, who), idempotency_key)
        except Exception:  # whatever it is, the route answers it as it does
            return False
        scope["route"] = self._route()  # for the request metrics' path label
        with tracing.submit_span(traceparent) as traced:
            if traced.traceparent is not None:
                run = dataclasses.replace(run, traceparent=traced.traceparent)
            try:
                result = await live.groups.submit(run)
            except Exception as exc:  # the app's handler renders it, or it is raised
                tracing.refused(traced, exc)
                state.fast_submits += 1
                await self._error(scope, receive, send, exc)
                return True
            tracing.submitted(traced, result.run.id, inserted=result.inserted)
        state.fast_submits += 1
        await submitted(result, live.waker, admin=who.admin)(scope, receive, send)
        return True

    async def _error(self, scope: Scope, receive: Receive, send: Send, exc: Exception) -> None:
        for kind in type(exc).__mro__:
            handler: Any = self.api.exception_handlers.get(kind)
            if handler is not None:
                response = await handler(Request(scope, receive), exc)
                await response(scope, receive, send)
                return
        raise exc

    @staticmethod
    def routes() -> list[BaseRoute]:
        return router.routes

    def _route(self) -> BaseRoute | None:
        if self.route is None:
            self.route = next((r for r in self.routes() if getattr(r, "path", None) == self.path
                               and "POST" in getattr(r, "methods", ())), None)
        return self.route
