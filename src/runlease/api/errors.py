"""Errors as HTTP answers: one JSON shape, `{"error": {code, message, field}}`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from runlease.errors import (
    BatchRefused,
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidTransition,
    RunleaseError,
    RunNotFound,
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
    if isinstance(exc, ValidationError):
        return error_response(422, "invalid_request", str(exc), exc.field)
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
    return error_response(exc.status_code, code, str(exc.detail),
                          headers=dict(exc.headers) if exc.headers else None)


def install(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ErrorAnswer, _error_answer)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(RunleaseError, _runlease_error)
