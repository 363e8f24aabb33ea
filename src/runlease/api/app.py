"""The HTTP control plane (FastAPI): routes in routes.py; here the app around
them: its lifespan (pool, feed hub, listener), body bound, CORS, metrics and
probes."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runlease import __version__, metrics
from runlease.api import (
    actions,
    batch,
    console,
    errors,
    humans,
    key_limits,
    routes,
    schedules,
    threads,
    usage,
    webhooks,
    workers,
)
from runlease.api.auth import ADMIN, StreamTokens, TokenRegistry
from runlease.api.deps import ApiState, Live, api_state
from runlease.api.errors import error_response
from runlease.api.fanout import Fanout
from runlease.api.fast_batch import FastBatch
from runlease.api.fast_submit import FastSubmit
from runlease.api.feeds import FeedHub
from runlease.api.schemas import ErrorBody
from runlease.api.submit_group import SubmitGroups
from runlease.api.wakeups import PoolWaker
from runlease.db.channels import EVENTS_CHANNEL
from runlease.db.connect import make_conn_pool
from runlease.db.store import RunStore
from runlease.errors import RunleaseError, SettingsError
from runlease.services.listener import Listener
from runlease.settings import ApiSettings

FAVICON = resources.files("runlease.api.console").joinpath("static/favicon.svg").read_bytes()
log = logging.getLogger(__name__)

READY_CHECK_S = 0.5  # /readyz answers within 1 s, well inside a probe's timeout

COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No token, or an unknown one."},
    403: {"model": ErrorBody, "description": "An admin-only route."},
    404: {"model": ErrorBody, "description": "No such run (or another tenant's), or a "
                                            "`pool` that does not exist (`unknown_pool`)."},
    422: {"model": ErrorBody, "description": "Bad input; `field` names it."},
    503: {"model": ErrorBody, "description": "The database is unavailable; retry."},
}


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    """Refuse request bodies over the bound before anything parses them."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 large: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.large = large or {}  # paths with a bound of their own (a batch)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.large.get(scope.get("path", ""), self.max_bytes)

        def too_big() -> Response:  # built only when sent: every request came here
            return error_response(413, "body_too_large",
                                  f"body: over the bound of {max_bytes} bytes", "body")

        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await too_big()(scope, receive, send)
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await too_big()(scope, receive, send)


class RequestMetrics:
    """Requests by route and status, and their duration (until the response
    starts, for event streams). A plain ASGI middleware: Starlette's
    BaseHTTPMiddleware costs a task and a stream per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()

        async def observing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                path = getattr(scope.get("route"), "path", "unmatched")
                method = scope["method"]
                metrics.child(metrics.API_REQUESTS, method, path,
                              str(message["status"])).inc()
                metrics.child(metrics.API_LATENCY, method, path).observe(
                    time.monotonic() - started)
            await send(message)

        await self.app(scope, receive, observing_send)


@contextmanager
def _naming(where: str) -> Iterator[None]:
    try:
        yield
    except (ValueError, SettingsError, OSError) as exc:
        raise SettingsError(f"{where}: {exc}") from None


def build_registry(settings: ApiSettings) -> TokenRegistry:
    """The tokens; a bad one is a settings error that names where it came from."""
    registry = TokenRegistry()
    with _naming("--tokens (RUNLEASE_TOKENS)"):
        if settings.tokens:
            registry.load_pairs(settings.tokens)
    with _naming("--admin-tokens (RUNLEASE_ADMIN_TOKENS)"):
        for token in settings.admin_tokens:
            registry.add(token, ADMIN)
    with _naming("--tokens-file (RUNLEASE_TOKENS_FILE)"):
        if settings.tokens_file:
            registry.load_file(settings.tokens_file)
    return registry


def _without_native_telemetry() -> dict[str, Any]:
    """FastAPI (0.165 and later) traces every request by itself once a tracer
    provider is installed (runlease/tracing.py installs one when asked):
    turned off, so the API's spans are runlease's own (`submit`, in the run's
    trace), a /metrics scrape or a console poll is no trace of its own, and
    no exception text reaches a collector without the redactor."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False,
                          "operation_spans": False}}


def create_app(settings: ApiSettings, *, tokens: TokenRegistry | None = None) -> FastAPI:
    if not settings.database_url:
        raise SettingsError("no database: set --database-url, RUNLEASE_DATABASE_URL or "
                            "DATABASE_URL")
    url: str = settings.database_url
    state = ApiState(settings=settings, tokens=tokens or build_registry(settings),
                     stream_tokens=StreamTokens(settings.stream_token_secret,
                                                settings.stream_token_ttl_s))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        conn_pool = make_conn_pool(url, min_size=1, max_size=20,
                                   prepare=settings.prepared_statements,
                                   application_name="runlease-api", generic_plans=True)
        await conn_pool.open(wait=False)
        store = RunStore(conn_pool, max_input_bytes=settings.max_input_bytes)
        # Streams hold two connections in all, however many there are: the
        # LISTEN session and the fan-out's reader (api/fanout.py).
        fanout = Fanout(store, url, prepare=settings.prepared_statements,
                        poll_s=settings.sse_poll_s)
        live = state.live = Live(
            store=store, waker=PoolWaker(store), groups=SubmitGroups(store),
            hub=FeedHub(store, fanout, keepalive_s=settings.sse_keepalive_s,
                        max_per_tenant=settings.sse_max_streams_per_tenant))
        listener = Listener(settings.listen_database_url or url,
                            {EVENTS_CHANNEL: fanout.notify}, on_connect=fanout.connected,
                            on_disconnect=fanout.disconnected,
                            application_name="runlease-api-listen")
        fanout.start()
        listener.start()
        log.info("api_started tokens=%d", len(state.tokens))
        if not len(state.tokens):
            log.warning("api_no_tokens every request will be refused (401): give tokens "
                        "with --tokens, --admin-tokens or --tokens-file (RUNLEASE_TOKENS, "
                        "RUNLEASE_ADMIN_TOKENS, RUNLEASE_TOKENS_FILE)")
        try:
            yield
        finally:
            await listener.stop(2)
            await fanout.stop()
            await live.groups.close()
            await live.waker.close()
            await conn_pool.close()

    # /docs (Swagger UI) and /redoc from assets in the fastapi-offline wheel,
    # not a CDN: they work offline and in air-gapped clusters.
    app = FastAPIOffline(
        static_url="/docs-static", favicon_url="/favicon.ico",
        title="runlease", version=__version__, lifespan=lifespan, responses=COMMON_ERRORS,
        description="A durable run queue for long-running AI agent runs. Every route takes "
                    "`Authorization: Bearer <token>`; a token belongs to one tenant or to "
                    "admin. Errors are `{\"error\": {\"code\", \"message\", \"field\"}}`.",
        **_without_native_telemetry(),
    )
    app.state.runlease = state
    errors.install(app)
    app.include_router(batch.router)
    app.include_router(routes.router)
    app.include_router(threads.router)
    app.include_router(humans.router)
    app.include_router(key_limits.router)
    app.include_router(actions.router)
    app.include_router(schedules.router)
    app.include_router(usage.router)
    app.include_router(webhooks.router)
    app.include_router(workers.router)
    console.install(app, settings)
    # Innermost of the middlewares: inside the body bound, metrics and CORS.
    app.add_middleware(FastSubmit, api=app, state=state)
    app.add_middleware(FastBatch, api=app, state=state)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"],
            expose_headers=["Location"])
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes,
                       large={"/v1/runs/batch": settings.max_batch_request_bytes})

    app.add_middleware(RequestMetrics)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        # What a browser asks every page for (the console links it too).
        return Response(FAVICON, media_type="image/svg+xml",
                        headers={"Cache-Control": "public, max-age=86400"})

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz(request: Request) -> JSONResponse:
        try:
            store = api_state(request).opened().store
            # Bounded as a whole (waiting for a connection included): a probe
            # that hangs is a probe that times out, and says nothing.
            async with asyncio.timeout(READY_CHECK_S), store.connection() as conn:
                await conn.execute("SELECT 1")
        except (RunleaseError, TimeoutError, AssertionError) as exc:
            why = str(exc) or f"no answer within {READY_CHECK_S} s"
            return error_response(503, "not_ready", f"database unreachable: {why}")
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app
