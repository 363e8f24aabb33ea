"""Python client for the runlease HTTP API, sync and async.

    from runlease.client import Client

    with Client("http://127.0.0.1:8080", token) as api:
        run = api.submit({"steps": [{"sleep": 1}]}, idempotency_key="order-42")
        for event in api.events(run.id):      # resumes by itself after a drop or a 503
            print(event)
        print(api.wait(run.id).status)

`AsyncClient` has the run methods (submit, get, list, cancel, wait, events, steps) and
dead_letters and redrive, as coroutines (events as an async iterator); it has no
stream_token, pools or upsert_pool. Both build requests and read answers the
same way (`_Calls`); only the I/O differs.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Self
from uuid import UUID

import httpx

from runlease.core.states import TERMINAL


class ApiError(Exception):
    """An error answer: `status`, and the body's code, message and field."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.field = status, code, message, field


# Answers after which a stream is reconnected, not given up: the API without
# its database (503, with Retry-After), or a gateway in front of an API that
# is restarting (502, 504).
RETRY_STATUSES = frozenset({502, 503, 504})


class NotFound(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Conflict(ApiError):
    """409: the run's state does not allow it (cancel or redrive of a finished
    run; the message names the status), or an Idempotency-Key reused with
    another input."""


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as the API shows it."""

    id: UUID
    pool: str
    tenant_id: str
    status: str
    priority: int
    attempts: int
    max_attempts: int
    input: dict[str, Any]
    budget: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    available_at: datetime
    last_event_seq: int = 0
    result: Any = None
    error_code: str | None = None
    error_message: str | None = None
    idempotency_key: str | None = None
    cancel_requested_at: datetime | None = None
    finished_at: datetime | None = None
    lease: dict[str, Any] | None = None
    created: bool = field(default=True, compare=False)  # False: an Idempotency-Key repeat

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, data: Mapping[str, Any], created: bool = True) -> RunView:
        stamps = ("created_at", "updated_at", "available_at", "cancel_requested_at",
                  "finished_at")
        values: dict[str, Any] = {
            k: (datetime.fromisoformat(v) if k in stamps and v else v)
            for k, v in data.items() if k in cls.__dataclass_fields__}
        values["id"] = UUID(str(data["id"]))
        values["created"] = created
        return cls(**values)


@dataclass(frozen=True, slots=True)
class RunPage:
    items: list[RunView]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class StepView:
    """A committed durable step of a run, as the API shows it."""

    key: str
    result: Any
    attempt: int
    lease_epoch: int
    created_at: datetime

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepView:
        return cls(key=data["key"], result=data.get("result"), attempt=data["attempt"],
                   lease_epoch=data["lease_epoch"],
                   created_at=datetime.fromisoformat(data["created_at"]))


@dataclass(frozen=True, slots=True)
class StepPage:
    items: list[StepView]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class StreamEvent:
    seq: int
    kind: str
    data: dict[str, Any]
    created_at: str


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The last item of an event stream: the run is finished."""

    status: str
    error_code: str | None
    attempts: int


class SseParser:
    """Server-Sent Events, line by line (the parts this API sends)."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> StreamEvent | RunEnded | None:
        if line == "":
            if not self._data:
                return None
            data, kind = "\n".join(self._data), self._event
            self._event, self._data = "message", []
            payload = json.loads(data)
            if kind == "end":
                return RunEnded(payload["status"], payload.get("error_code"),
                                payload.get("attempts", 0))
            return StreamEvent(payload["seq"], payload["kind"], payload.get("data", {}),
                               payload.get("created_at", ""))
        if line.startswith(":"):
            return None  # a keepalive comment
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None  # `id` needs no keeping: the event's seq is in its data


class _Calls:
    """Request building and answer reading, shared by both clients."""

    def __init__(self, api_url: str, token: str | None) -> None:
        self.base = api_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    @staticmethod
    def check(response: httpx.Response) -> Any:
        if response.status_code < 400:
            return response.json() if response.content else None
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            error = {"code": "http_error", "message": response.text[:500]}
        kind = {404: NotFound, 401: Unauthorized, 409: Conflict}.get(response.status_code,
                                                                   ApiError)
        raise kind(response.status_code, error.get("code", "error"),
                   error.get("message", ""), error.get("field"))

    @staticmethod
    def submit_body(input: Mapping[str, Any], pool: str | None, priority: int | None,  # noqa: A002
                    max_attempts: int | None, budget: Mapping[str, Any] | None,
                    tenant_id: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"input": dict(input)}
        for key, value in (("pool", pool), ("priority", priority), ("max_attempts", max_attempts),
                           ("budget", budget), ("tenant_id", tenant_id)):
            if value is not None:
                body[key] = value
        return body

    @staticmethod
    def list_params(status: str | None, pool: str | None, limit: int,
                    cursor: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if pool:
            params["pool"] = pool
        if cursor:
            params["cursor"] = cursor
        return params

    @staticmethod
    def page(data: Mapping[str, Any]) -> RunPage:
        return RunPage([RunView.from_json(i) for i in data["items"]], data.get("next_cursor"))

    @staticmethod
    def steps_params(limit: int, cursor: str | None) -> dict[str, Any]:
        return {"limit": limit, **({"cursor": cursor} if cursor else {})}

    @staticmethod
    def step_page(data: Mapping[str, Any]) -> StepPage:
        return StepPage([StepView.from_json(i) for i in data["items"]], data.get("next_cursor"))

    def stream_headers(self, after: int) -> dict[str, str]:
        return {**self.headers, "Accept": "text/event-stream", "Last-Event-ID": str(after)}


class Client:
    """Synchronous client."""

    def __init__(self, api_url: str, token: str | None = None, *, timeout_s: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._calls = _Calls(api_url, token)
        self._http = httpx.Client(base_url=self._calls.base, headers=self._calls.headers,
                                  timeout=timeout_s, transport=transport)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._calls.check(self._http.request(method, path, **kwargs))

    def submit(self, input: Mapping[str, Any], *, pool: str | None = None,  # noqa: A002
               priority: int | None = None, max_attempts: int | None = None,
               budget: Mapping[str, Any] | None = None, idempotency_key: str | None = None,
               tenant_id: str | None = None) -> RunView:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = self._http.post("/v1/runs", headers=headers, json=self._calls.submit_body(
            input, pool, priority, max_attempts, budget, tenant_id))
        return RunView.from_json(self._calls.check(response), response.status_code == 201)

    def get(self, run_id: UUID | str) -> RunView:
        return RunView.from_json(self._call("GET", f"/v1/runs/{run_id}"))

    def list(self, *, status: str | None = None, pool: str | None = None, limit: int = 50,
             cursor: str | None = None) -> RunPage:
        return self._calls.page(self._call("GET", "/v1/runs", params=self._calls.list_params(
            status, pool, limit, cursor)))

    def cancel(self, run_id: UUID | str) -> RunView:
        return RunView.from_json(self._call("POST", f"/v1/runs/{run_id}/cancel"))

    def steps(self, run_id: UUID | str, *, limit: int = 20,
              cursor: str | None = None) -> StepPage:
        """A page of the run's committed steps, in step-key order."""
        return self._calls.step_page(self._call("GET", f"/v1/runs/{run_id}/steps",
                                                params=self._calls.steps_params(limit, cursor)))

    def wait(self, run_id: UUID | str, *, timeout_s: float = 300.0) -> RunView:
        """Poll until the run is finished (done, dead or cancelled)."""
        deadline, delay = time.monotonic() + timeout_s, 0.1
        while True:
            run = self.get(run_id)
            if run.finished:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {run.status} after {timeout_s} s")
            time.sleep(delay)
            delay = min(2.0, delay * 1.5)

    def events(self, run_id: UUID | str, *, after: int = 0, max_reconnects: int | None = None,
               read_timeout_s: float = 60.0) -> Iterator[StreamEvent | RunEnded]:
        """The run's events, live; reconnects with Last-Event-ID after a drop
        (or a 502, 503 or 504 answer), so nothing is lost or repeated; ends
        after RunEnded."""
        reconnects, delay = 0, 0.2
        while True:
            parser = SseParser()
            try:
                with self._http.stream("GET", f"/v1/runs/{run_id}/events",
                                       headers=self._calls.stream_headers(after),
                                       timeout=httpx.Timeout(10.0, read=read_timeout_s)) as r:
                    if r.status_code >= 400:
                        r.read()
                        self._calls.check(r)
                    for line in r.iter_lines():
                        item = parser.feed(line)
                        if isinstance(item, StreamEvent):
                            after = item.seq
                            delay = 0.2
                        if item is not None:
                            yield item
                        if isinstance(item, RunEnded):
                            return
            except httpx.TransportError:
                pass
            except ApiError as exc:
                if exc.status not in RETRY_STATUSES:
                    raise
            reconnects += 1
            if max_reconnects is not None and reconnects > max_reconnects:
                raise ConnectionError(f"event stream of {run_id} dropped {reconnects} times")
            time.sleep(delay)
            delay = min(5.0, delay * 2)

    def stream_token(self, run_id: UUID | str) -> dict[str, Any]:
        return self._call("POST", f"/v1/runs/{run_id}/stream-token")  # type: ignore[no-any-return]

    # -- admin ----------------------------------------------------------------------------

    def dead_letters(self, *, pool: str | None = None, limit: int = 50,
                     cursor: str | None = None) -> RunPage:
        return self._calls.page(self._call("GET", "/v1/dead-letters", params=self._calls
                                           .list_params(None, pool, limit, cursor)))

    def redrive(self, run_id: UUID | str) -> RunView:
        return RunView.from_json(self._call("POST", f"/v1/runs/{run_id}/redrive"))

    def pools(self) -> builtins.list[dict[str, Any]]:
        return self._call("GET", "/v1/pools")  # type: ignore[no-any-return]

    def pool(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/pools/{name}")  # type: ignore[no-any-return]

    def upsert_pool(self, name: str, **settings: Any) -> dict[str, Any]:
        """PUT the pool: settings left out take their defaults (see pool())."""
        return self._call("PUT", f"/v1/pools/{name}", json=settings)  # type: ignore[no-any-return]


class AsyncClient:
    """Asynchronous client, for agent platforms running on asyncio."""

    def __init__(self, api_url: str, token: str | None = None, *, timeout_s: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._calls = _Calls(api_url, token)
        self._http = httpx.AsyncClient(base_url=self._calls.base, headers=self._calls.headers,
                                       timeout=timeout_s, transport=transport)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._calls.check(await self._http.request(method, path, **kwargs))

    async def submit(self, input: Mapping[str, Any], *, pool: str | None = None,  # noqa: A002
                     priority: int | None = None, max_attempts: int | None = None,
                     budget: Mapping[str, Any] | None = None,
                     idempotency_key: str | None = None,
                     tenant_id: str | None = None) -> RunView:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = await self._http.post("/v1/runs", headers=headers,
                                         json=self._calls.submit_body(
                                             input, pool, priority, max_attempts, budget,
                                             tenant_id))
        return RunView.from_json(self._calls.check(response), response.status_code == 201)

    async def get(self, run_id: UUID | str) -> RunView:
        return RunView.from_json(await self._call("GET", f"/v1/runs/{run_id}"))

    async def list(self, *, status: str | None = None, pool: str | None = None,
                   limit: int = 50, cursor: str | None = None) -> RunPage:
        return self._calls.page(await self._call(
            "GET", "/v1/runs", params=self._calls.list_params(status, pool, limit, cursor)))

    async def cancel(self, run_id: UUID | str) -> RunView:
        return RunView.from_json(await self._call("POST", f"/v1/runs/{run_id}/cancel"))

    async def steps(self, run_id: UUID | str, *, limit: int = 20,
                    cursor: str | None = None) -> StepPage:
        """A page of the run's committed steps, in step-key order."""
        return self._calls.step_page(await self._call(
            "GET", f"/v1/runs/{run_id}/steps", params=self._calls.steps_params(limit, cursor)))

    async def wait(self, run_id: UUID | str, *, timeout_s: float = 300.0) -> RunView:
        deadline, delay = time.monotonic() + timeout_s, 0.1
        while True:
            run = await self.get(run_id)
            if run.finished:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {run.status} after {timeout_s} s")
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 1.5)

    async def events(self, run_id: UUID | str, *, after: int = 0,
                     max_reconnects: int | None = None,
                     read_timeout_s: float = 60.0) -> AsyncIterator[StreamEvent | RunEnded]:
        reconnects, delay = 0, 0.2
        while True:
            parser = SseParser()
            try:
                async with self._http.stream(
                        "GET", f"/v1/runs/{run_id}/events",
                        headers=self._calls.stream_headers(after),
                        timeout=httpx.Timeout(10.0, read=read_timeout_s)) as r:
                    if r.status_code >= 400:
                        await r.aread()
                        self._calls.check(r)
                    async for line in r.aiter_lines():
                        item = parser.feed(line)
                        if isinstance(item, StreamEvent):
                            after = item.seq
                            delay = 0.2
                        if item is not None:
                            yield item
                        if isinstance(item, RunEnded):
                            return
            except httpx.TransportError:
                pass
            except ApiError as exc:
                if exc.status not in RETRY_STATUSES:
                    raise
            reconnects += 1
            if max_reconnects is not None and reconnects > max_reconnects:
                raise ConnectionError(f"event stream of {run_id} dropped {reconnects} times")
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)

    async def dead_letters(self, *, pool: str | None = None, limit: int = 50,
                           cursor: str | None = None) -> RunPage:
        return self._calls.page(await self._call(
            "GET", "/v1/dead-letters", params=self._calls.list_params(None, pool, limit, cursor)))

    async def redrive(self, run_id: UUID | str) -> RunView:
        return RunView.from_json(await self._call("POST", f"/v1/runs/{run_id}/redrive"))
