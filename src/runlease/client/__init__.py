"""Python client for the runlease HTTP API, sync and async.

    from runlease.client import Client

    with Client("http://127.0.0.1:8080", token) as api:
        run = api.submit({"steps": [{"sleep": 1}]}, idempotency_key="order-42")
        for event in api.events(run.id):      # resumes by itself after a drop or a 503
            print(event)
        print(api.wait(run.id).status)

`AsyncClient` has the run methods (submit, get, list, cancel, wait, events, steps) and
dead_letters and redrive, as coroutines (events as an async iterator); it has no
stream_token, pools or upsert_pool. Each call is declared once (`calls.py`:
its request and how its answer reads); the two clients only send it.
"""

from __future__ import annotations

from runlease.client.aio import AsyncClient
from runlease.client.errors import RETRY_STATUSES, ApiError, Conflict, NotFound, Unauthorized
from runlease.client.sse import RunEnded, SseParser, StreamEvent
from runlease.client.sync import Client
from runlease.client.views import RunPage, RunView, StepPage, StepView

__all__ = [
    "RETRY_STATUSES",
    "ApiError",
    "AsyncClient",
    "Client",
    "Conflict",
    "NotFound",
    "RunEnded",
    "RunPage",
    "RunView",
    "SseParser",
    "StepPage",
    "StepView",
    "StreamEvent",
    "Unauthorized",
]
