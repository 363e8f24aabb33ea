"""Errors as HTTP answers: one JSON shape, `{"error": {code, message, field}}`."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from runlease.db.humans import InboxFull, InputRefused, MessageRefused
from runlease.errors import (
    BatchRefused,
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidTransition,
    NotAllowed,
    RunleaseError,
    RunNotFound,
    ThreadBusy,
    UnknownPool,
    ValidationError,
)

log = logging.getLogger(__name__)


class ErrorAnswer(Exception):
    """Raised in a route to answer with an error: the server's side of what
    an HTTP caller sees as `runlease.client.ApiError`."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers


def error_response(status: int, code: str, message: str, field: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "field": field}},
                        status_code=status, headers=headers)


def unauthorized(message: str = "a valid bearer token is required") -> ErrorAnswer:
    return ErrorAnswer(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def invalid(field: str, message: str) -> ErrorAnswer:
    return ErrorAnswer(422, "invalid_request", f"{field}: {message}", field)


async def _error_answer(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ErrorAnswer)
    return error_response(exc.status, exc.code, exc.message, exc.field, exc.headers)


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    literal = request.app.openapi().get("paths", {}).get(request.url.path)
    if literal is not None and request.method.lower() not in literal:
        # PATCH /v1/runs/redrive reached PATCH /v1/runs/{run_id}: the path is
        # a resource of its own, which does not take this method.
        return error_response(405, "method_not_allowed", "Method Not Allowed",
                              headers={"Allow": allowed_methods(request)})
    errors = exc.errors()
    first = errors[0] if errors else {}
    raw = tuple(first.get("loc", ()))
    # A repeatable query parameter is named, not its n-th value.
    loc = [str(p) for p in raw if p not in ("body", "query", "path", "header")
           and not (raw[:1] == ("query",) and isinstance(p, int))]
    field = "body" if first.get("type") == "json_invalid" or not loc else ".".join(loc)
    if raw[:2] == ("body", "runs") and len(raw) > 2 and isinstance(raw[2], int):
        field = f"runs[{raw[2]}]" + "".join(f".{p}" for p in raw[3:])  # as the store names it
    items = _batch_items(errors)
    response = error_response(422, "invalid_request", f"{field}: {first.get('msg', 'invalid')}",
                              field)
    if items:
        return JSONResponse({"error": {"code": "invalid_request",
                                       "message": f"{field}: {first.get('msg', 'invalid')}",
                                       "field": field}, "errors": items}, status_code=422)
    return response


def _batch_items(errors: Sequence[Any]) -> list[dict[str, object]]:
    """A batch's refused items by index (POST /v1/runs/batch: body.runs.<i>...)."""
    items: list[dict[str, object]] = []
    for e in errors:
        loc = tuple(e.get("loc", ()))
        if len(loc) >= 3 and loc[:2] == ("body", "runs") and isinstance(loc[2], int):
            field = ".".join(str(p) for p in loc[3:]) or None
            items.append({"index": loc[2], "code": "invalid_request", "field": field,
                          "message": f"{field or 'item'}: {e.get('msg', 'invalid')}"})
    return items[:1000]


_BY_TYPE: list[tuple[type[RunleaseError], int, str]] = [
    (RunNotFound, 404, "not_found"),
    (IdempotencyConflict, 409, "idempotency_conflict"),
    (InvalidTransition, 409, "invalid_transition"),
]


async def _runlease_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, BatchRefused):
        return JSONResponse({"error": {"code": "batch_refused", "message": str(exc),
                                       "field": exc.field},
                             "errors": [e.as_dict() for e in exc.errors]}, status_code=422)
    if isinstance(exc, UnknownPool):
        # Well-formed, naming something that does not exist (yet): a 404 that
        # names the field, as a missing run is a 404.
        return error_response(404, "unknown_pool", str(exc), exc.field)
    if isinstance(exc, NotAllowed):
        return error_response(403, "not_allowed", str(exc), exc.field)
    if isinstance(exc, ValidationError):
        return error_response(422, "invalid_request", str(exc), exc.field)
    if isinstance(exc, ThreadBusy):
        # Names the active run, as `multitask: reject` promises.
        return JSONResponse({"error": {"code": "thread_busy", "message": str(exc),
                                       "field": "thread_id"},
                             "active_run_id": str(exc.run_id)}, status_code=409)
    if isinstance(exc, InboxFull):
        return error_response(429, "inbox_full", str(exc),
                              headers={"Retry-After": str(int(exc.retry_s))})
    if isinstance(exc, InputRefused):
        return error_response(409, "input_refused", str(exc), "name")
    if isinstance(exc, MessageRefused):
        return error_response(409, "run_finished", str(exc))
    if isinstance(exc, DatabaseUnavailable):
        return error_response(503, "database_unavailable", "the database is unavailable",
                              headers={"Retry-After": "1"})
    for kind, status, code in _BY_TYPE:
        if isinstance(exc, kind):
            # A missing run and another tenant's read the same: no hint which.
            message = "run not found" if status == 404 else str(exc)
            field = "Idempotency-Key" if kind is IdempotencyConflict else None
            return error_response(status, code, message, field)
    log.error("api_error error=%s", exc, exc_info=exc)
    return error_response(500, "internal", "internal error")


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (unknown route, wrong method, an unreadable
    body) in our shape; a body that is not even text is malformed input."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 400 and "body" in str(exc.detail).lower():
        return error_response(422, "invalid_request", "body: not valid JSON", "body")
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    headers = dict(exc.headers) if exc.headers else {}
    if exc.status_code == 405:
        headers["Allow"] = allowed_methods(request) or headers.get("Allow", "")
    return error_response(exc.status_code, code, str(exc.detail), headers=headers or None)


_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


def allowed_methods(request: Request) -> str:
    """Every method the OpenAPI document gives this path: Starlette's own 405
    names only the first route's (GET of GET /v1/runs, not POST /v1/runs)."""
    path = request.url.path
    paths: dict[str, dict[str, Any]] = request.app.openapi().get("paths", {})
    # A literal path (/v1/runs/cancel) is its own resource, though
    # /v1/runs/{run_id} would match it too.
    item = paths.get(path) or next(
        (item for template, item in paths.items()
         if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), path)),
        {})
    return ", ".join(sorted(m.upper() for m in item if m in _METHODS))


def install(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ErrorAnswer, _error_answer)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(RunleaseError, _runlease_error)
