"""The web console, served under /ui/ by the API (and so by `runlease dev`).

Server-rendered (Jinja2 templates in templates/), live parts by htmx and
console.js (static/, vendored: no CDN). Signed in with a tenant or admin
token, kept in a signed session cookie (session.py); a tenant sees only its
own runs, as through the API.

    deps.py     who is looking; CSRF and origin checks for forms
    runs.py     sign in/out, the runs table, one run, cancel and redrive
    ops.py      dead letters, pools, workers (admin)
    usage.py    tokens and cost per day, tenant and pool
    timeline.py a run's attempts, steps and tool calls drawn to scale
    render.py   templates and security headers
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from runlease.api.console import ops, runs, usage
from runlease.api.console.deps import BadRequest, ConsoleState, Refused, SignIn, console_state
from runlease.api.console.session import Sessions
from runlease.settings import ApiSettings

Handler = Callable[[Request, Exception], Awaitable[Response]]
AnyHandler = Callable[[Request, Any], Response | Awaitable[Response]]
STATIC = resources.files("runlease.api.console").joinpath("static")


def _error(request: Request, status: int, message: str) -> Response:
    return console_state(request).renderer.page(
        request, "error.html", {"status": status, "message": message}, status)


async def _sign_in(request: Request, exc: Exception) -> Response:
    if request.headers.get("hx-request"):
        # A live fragment: htmx follows HX-Redirect with a full page load.
        return Response(status_code=401, headers={"HX-Redirect": "/ui/login"})
    return RedirectResponse("/ui/login", status_code=303)


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return _error(request, exc.status, exc.message)


async def _bad_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BadRequest)
    return _error(request, 400, exc.message)


def _pages_first(api_handler: AnyHandler | None) -> Handler:
    """A bad path or query value on a console page is a page saying so; on
    the API, the API's JSON error as before."""

    async def handler(request: Request, exc: Exception) -> Response:
        if request.url.path.startswith("/ui/") or api_handler is None:
            return _error(request, 400, "This address is not one the console knows "
                                        "(a run id is a UUID).")
        answer = api_handler(request, exc)
        return await answer if inspect.isawaitable(answer) else answer

    return handler


def install(app: FastAPI, settings: ApiSettings) -> None:
    """Mount the console on the app: /ui/ pages and /ui/static/ files."""
    app.state.console = ConsoleState(Sessions(settings.console_secret,
                                              settings.console_session_s))
    app.include_router(runs.router)
    app.include_router(ops.router)
    app.include_router(usage.router)
    app.mount("/ui/static", StaticFiles(directory=str(STATIC)), name="console-static")
    app.add_exception_handler(SignIn, _sign_in)
    app.add_exception_handler(Refused, _refused)
    app.add_exception_handler(BadRequest, _bad_request)
    app.add_exception_handler(RequestValidationError, _pages_first(
        app.exception_handlers.get(RequestValidationError)))

    @app.get("/ui", include_in_schema=False)
    async def ui_root() -> Response:
        return RedirectResponse("/ui/", status_code=307)

