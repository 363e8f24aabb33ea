"""Each API call declared once, for both clients: its request (method, path,
query, body, headers) and how its answer reads. Client and AsyncClient only
send it; the polling of wait() and the reading of an event stream are shared
here too, so only the I/O differs between them."""

from __future__ import annotations

import builtins
import functools
import inspect
import sys
import time
import types
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, overload
from uuid import UUID

import httpx

from runlease.client.errors import ApiError, Conflict, NotFound, Unauthorized
from runlease.client.views import RunPage, RunView, StepPage, StepView

T = TypeVar("T")
P = ParamSpec("P")
F = TypeVar("F", bound=Callable[..., Any])

MAX_BATCH = 1000  # runs per POST /v1/runs/batch

# How long a stream may wait to connect, and (by default) between two lines:
# the API sends a keepalive comment well within it.
STREAM_CONNECT_S = 10.0


def check(response: httpx.Response) -> Any:
    """The answer's JSON (None when empty), or its error raised as ApiError."""
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


def _run(response: httpx.Response) -> RunView:
    return RunView.from_json(check(response), response.status_code == 201)


def _runs(response: httpx.Response) -> RunPage:
    data = check(response)
    return RunPage([RunView.from_json(i) for i in data["items"]], data.get("next_cursor"))


def _batch(response: httpx.Response) -> builtins.list[RunView]:
    data = check(response)
    created = data.get("created") or [True] * len(data["runs"])
    return [RunView.from_json(r, c) for r, c in zip(data["runs"], created, strict=True)]


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def chunks(runs: Iterable[Mapping[str, Any]],
           size: int) -> Iterator[builtins.list[Mapping[str, Any]]]:
    """The runs in lists of `size` (1 to MAX_BATCH), for submit_many."""
    if not 1 <= size <= MAX_BATCH:
        raise ValueError(f"chunk must be between 1 and {MAX_BATCH}, got {size}")
    part: builtins.list[Mapping[str, Any]] = []
    for run in runs:
        part.append(run)
        if len(part) == size:
            yield part
            part = []
    if part:
        yield part


def _secret(response: httpx.Response) -> str:
    return str(check(response)["secret"])


def _steps(response: httpx.Response) -> StepPage:
    data = check(response)
    return StepPage([StepView.from_json(i) for i in data["items"]], data.get("next_cursor"))


def _page_params(limit: int, cursor: str | None, **filters: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"limit": limit, **{k: v for k, v in filters.items() if v}}
    if cursor:
        params["cursor"] = cursor
    return params


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request, and how its answer reads."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] | None = None

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        return http.build_request(self.method, self.path, params=self.params, json=self.json,
                                  headers=self.headers)


class _Sends(Protocol):
    def _send(self, call: Call[T], /) -> T: ...


class _SendsAsync(Protocol):
    def _send(self, call: Call[T], /) -> Coroutine[Any, Any, T]: ...


class sends(Generic[P, T]):
    """The client method that sends the call `build` declares, written once
    for both clients: on Client (whose `_send` answers) it returns the answer,
    on AsyncClient (whose `_send` is a coroutine) a coroutine of it. Its
    signature and docstring are the call's."""

    def __init__(self, build: Callable[P, Call[T]]) -> None:
        def method(client: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
            answer: T = client._send(build(*args, **kwargs))
            return answer

        async def method_async(client: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
            answer: T = await client._send(build(*args, **kwargs))
            return answer

        self._sync = _described(method, build)
        self._async = _described(method_async, build)

    def _for(self, owner: type[Any]) -> Callable[..., Any]:
        send = getattr(owner, "_send", None)
        return self._async if inspect.iscoroutinefunction(send) else self._sync

    @overload
    def __get__(self, client: None, owner: type[Any], /) -> Callable[..., Any]: ...
    @overload
    def __get__(self, client: _SendsAsync, owner: type[Any] | None = None, /
                ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, client: _Sends, owner: type[Any] | None = None, /) -> Callable[P, T]: ...

    def __get__(self, client: Any, owner: type[Any] | None = None, /) -> Any:
        if client is None:  # Client.get: the function, for help()
            return self._for(owner or object)
        return types.MethodType(self._for(type(client)), client)


def _described(method: F, build: Callable[..., Any]) -> F:
    """The method's name, docstring and signature (for help()) are the call's,
    but for the client it is called on (which binding drops) and what it
    returns: the answer read, not the Call."""
    functools.update_wrapper(method, build)
    del method.__wrapped__  # type: ignore[attr-defined]
    signature = inspect.signature(build)
    client = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[client, *signature.parameters.values()],
        return_annotation=inspect.Signature.empty)
    return method


def _rerun(response: httpx.Response) -> RunView:
    return RunView.from_json(check(response)["run"])


def _items(response: httpx.Response) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = check(response)["items"]
    return items


class Calls:
    """The API's calls, built for one base URL and token."""

    def __init__(self, api_url: str, token: str | None) -> None:
        self.base = api_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def http_options(self, timeout_s: float, transport: Any) -> dict[str, Any]:
        """The arguments of the client's httpx.Client (or AsyncClient)."""
        return {"base_url": self.base, "headers": self.headers, "timeout": timeout_s,
                "transport": transport}

    # -- runs -------------------------------------------------------------------------------

    @staticmethod
    def submit(input: Mapping[str, Any], *, pool: str | None = None,  # noqa: A002
               priority: int | None = None, max_attempts: int | None = None,
               budget: Mapping[str, Any] | None = None, idempotency_key: str | None = None,
               tenant_id: str | None = None, labels: Mapping[str, str] | None = None,
               run_at: datetime | str | None = None, delay_s: float | None = None,
               parent_run_id: UUID | str | None = None,
               webhook_url: str | None = None,
               backoff_base_s: int | None = None, backoff_cap_s: int | None = None,
               non_retryable_codes: Sequence[str] | None = None,
               thread_id: str | None = None, multitask: str | None = None,
               concurrency_key: str | None = None,
               singleton: Mapping[str, Any] | None = None,
               debounce: Mapping[str, Any] | None = None) -> Call[RunView]:
        """Enqueue a run; `labels` to find it by, `run_at` or `delay_s` to start it
        later; `parent_run_id` makes it a child of that run; `webhook_url` is POSTed
        a signed notice when it ends; backoff_* and non_retryable_codes its retry
        policy (left out: 5 s doubling up to 300 s, every error retried);
        `thread_id` puts it in a thread (one run at a time, in submit order) and
        `multitask` says what to do when the thread is busy: enqueue (default),
        reject (Conflict, `thread_busy`), interrupt or rollback; `concurrency_key`
        counts it against the pool's limit for that key; `singleton` ({"key",
        "on_conflict"}) and `debounce` ({"key", "window_s", "max_delay_s"}) may
        answer with the key's existing run (created False)."""
        body: dict[str, Any] = {"input": dict(input)}
        for key, value in (("pool", pool), ("priority", priority), ("max_attempts", max_attempts),
                           ("budget", budget), ("tenant_id", tenant_id), ("labels", labels),
                           ("run_at", run_at), ("delay_s", delay_s),
                           ("parent_run_id", None if parent_run_id is None
                            else str(parent_run_id)), ("webhook_url", webhook_url),
                           ("backoff_base_s", backoff_base_s), ("backoff_cap_s", backoff_cap_s),
                           ("non_retryable_codes", None if non_retryable_codes is None
                            else [*non_retryable_codes]),
                           ("thread_id", thread_id), ("multitask", multitask),
                           ("concurrency_key", concurrency_key),
                           ("singleton", None if singleton is None else dict(singleton)),
                           ("debounce", None if debounce is None else dict(debounce))):
            if value is not None:
                body[key] = _jsonable(value)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        if (traceparent := _current_traceparent()) is not None:
            headers["traceparent"] = traceparent
        return Call("POST", "/v1/runs", _run, json=body, headers=headers)

    @staticmethod
    def submit_batch(runs: Sequence[Mapping[str, Any]]) -> Call[builtins.list[RunView]]:
        """Each run a single submit's body (`input`, `pool`, `labels`,
        `run_at`...) and its `idempotency_key`."""
        body = {"runs": [{k: _jsonable(v) for k, v in run.items() if v is not None}
                         for run in runs]}
        return Call("POST", "/v1/runs/batch", _batch, json=body)

    @staticmethod
    def get(run_id: UUID | str) -> Call[RunView]:
        return Call("GET", f"/v1/runs/{run_id}", _run)

    @staticmethod
    def list(*, status: str | Sequence[str] | None = None, pool: str | None = None,
             limit: int = 50, cursor: str | None = None,
             label: Sequence[str] | Mapping[str, str] | None = None,
             created_after: datetime | None = None, created_before: datetime | None = None,
             finished_after: datetime | None = None, finished_before: datetime | None = None,
             idempotency_key: str | None = None, tenant: str | None = None,
             parent_run_id: UUID | str | None = None,
             id_prefix: str | None = None,
             thread_id: str | None = None) -> Call[RunPage]:
        """A page of runs, newest first, filtered (every filter given must match:
        any of `status`, all of `label` as "key=value", "key:value" or a dict;
        `id_prefix`: ids starting with it, at least 8 hex digits)."""
        params = _page_params(limit, cursor, pool=pool, idempotency_key=idempotency_key,
                              id_prefix=id_prefix,
                              tenant=tenant, parent_run_id=None if parent_run_id is None
                              else str(parent_run_id), thread_id=thread_id)
        if status:
            params["status"] = [status] if isinstance(status, str) else builtins.list(status)
        if label:
            params["label"] = ([f"{k}:{v}" for k, v in label.items()]
                               if isinstance(label, Mapping) else builtins.list(label))
        for key, at in (("created_after", created_after), ("created_before", created_before),
                        ("finished_after", finished_after),
                        ("finished_before", finished_before)):
            if at is not None:
                params[key] = at.isoformat()
        return Call("GET", "/v1/runs", _runs, params=params)

    @staticmethod
    def thread(thread_id: str, *, tenant: str | None = None) -> Call[dict[str, Any]]:
        """A thread: its head (active or next run), latest answer, runs submitted."""
        params = {"tenant": tenant} if tenant else {}
        return Call("GET", f"/v1/threads/{thread_id}", check, params=params)

    @staticmethod
    def thread_runs(thread_id: str, *, tenant: str | None = None, limit: int = 50,
                    cursor: str | None = None) -> Call[RunPage]:
        """A page of a thread's runs in submit order, oldest first."""
        return Call("GET", f"/v1/threads/{thread_id}/runs", _runs,
                    params=_page_params(limit, cursor, tenant=tenant))

    @staticmethod
    def cancel(run_id: UUID | str) -> Call[RunView]:
        return Call("POST", f"/v1/runs/{run_id}/cancel", _run)

    @staticmethod
    def give_input(run_id: UUID | str, name: str, value: Any) -> Call[dict[str, Any]]:
        """Answer the run's request for input `name` (once; the same answer
        again is a no-op, another is a Conflict): {"resumed", "run"}."""
        return Call("POST", f"/v1/runs/{run_id}/input", check,
                    json={"name": name, "value": value})

    @staticmethod
    def input_requests(run_id: UUID | str) -> Call[builtins.list[dict[str, Any]]]:
        """What the run asked people; open requests carry a single-use resume_url."""
        return Call("GET", f"/v1/runs/{run_id}/input", _items)

    @staticmethod
    def send_message(run_id: UUID | str, text: str,
                     data: dict[str, Any] | None = None) -> Call[dict[str, Any]]:
        """Into the run's inbox (its agent takes it at its next turn), or the
        answer of its open request for free text: {"seq", "answered_input", ...}."""
        body: dict[str, Any] = {"text": text}
        if data is not None:
            body["data"] = data
        return Call("POST", f"/v1/runs/{run_id}/messages", check, json=body)

    @staticmethod
    def messages(run_id: UUID | str, *, after: int = 0,
                 limit: int = 100) -> Call[builtins.list[dict[str, Any]]]:
        return Call("GET", f"/v1/runs/{run_id}/messages", _items,
                    params={"after": after, "limit": limit})

    @staticmethod
    def rerun(run_id: UUID | str, *, from_step: str | None = None,
              input: dict[str, Any] | None = None) -> Call[RunView]:  # noqa: A002
        """A new run of the same tenant, pool and thread; with from_step, the
        steps committed before it are copied, so they are not run again."""
        body: dict[str, Any] = {}
        if from_step is not None:
            body["from_step"] = from_step
        if input is not None:
            body["input"] = input
        return Call("POST", f"/v1/runs/{run_id}/rerun", _rerun, json=body)

    @staticmethod
    def steps(run_id: UUID | str, *, limit: int = 20,
              cursor: str | None = None) -> Call[StepPage]:
        """A page of the run's committed steps, in step-key order."""
        return Call("GET", f"/v1/runs/{run_id}/steps", _steps,
                    params=_page_params(limit, cursor))

    @staticmethod
    def stream_token(run_id: UUID | str) -> Call[dict[str, Any]]:
        return Call("POST", f"/v1/runs/{run_id}/stream-token", check)

    def events(self, run_id: UUID | str, after: int, read_timeout_s: float) -> dict[str, Any]:
        """The arguments of the stream request for the run's events after `after`."""
        return {"method": "GET", "url": f"/v1/runs/{run_id}/events",
                "headers": {**self.headers, "Accept": "text/event-stream",
                            "Last-Event-ID": str(after)},
                "timeout": httpx.Timeout(STREAM_CONNECT_S, read=read_timeout_s)}

    @staticmethod
    def webhook(run_id: UUID | str) -> Call[dict[str, Any]]:
        """The run's webhook delivery: {url, state, tries, attempts, ...}."""
        return Call("GET", f"/v1/runs/{run_id}/webhook", check)

    @staticmethod
    def webhook_secret(*, rotate: bool = False, tenant_id: str | None = None) -> Call[str]:
        """The key that signs the tenant's deliveries (a new one with rotate)."""
        return Call("POST" if rotate else "GET",
                    "/v1/webhook-secret/rotate" if rotate else "/v1/webhook-secret", _secret,
                    params={"tenant_id": tenant_id} if tenant_id else None)

    @staticmethod
    def usage(*, start: date | str | None = None, end: date | str | None = None,
              group_by: str = "day", tenant_id: str | None = None,
              pool: str | None = None) -> Call[dict[str, Any]]:
        """Usage (tokens, cost) from `start` to `end` (UTC days, inclusive),
        grouped by "tenant", "pool" or "day": GET /v1/usage's JSON."""
        params: dict[str, Any] = {"group_by": group_by}
        for key, value in (("from", start), ("to", end), ("tenant_id", tenant_id),
                           ("pool", pool)):
            if value is not None:
                params[key] = str(value)
        return Call("GET", "/v1/usage", check, params=params)

    # -- admin ------------------------------------------------------------------------------

    @staticmethod
    def webhook_hosts(hosts: builtins.list[dict[str, Any]] | None = None
                      ) -> Call[dict[str, Any]]:
        """The webhook allowlist (admin): {hosts: [{host, allow_private, ports}]}; with
        `hosts`, make it exactly those first."""
        if hosts is None:
            return Call("GET", "/v1/webhook-hosts", check)
        return Call("PUT", "/v1/webhook-hosts", check, json={"hosts": hosts})

    @staticmethod
    def dead_letters(*, pool: str | None = None, limit: int = 50,
                     cursor: str | None = None) -> Call[RunPage]:
        return Call("GET", "/v1/dead-letters", _runs,
                    params=_page_params(limit, cursor, pool=pool))

    @staticmethod
    def redrive(run_id: UUID | str) -> Call[RunView]:
        return Call("POST", f"/v1/runs/{run_id}/redrive", _run)

    @staticmethod
    def pools() -> Call[builtins.list[dict[str, Any]]]:
        return Call("GET", "/v1/pools", check)

    @staticmethod
    def pool(name: str) -> Call[dict[str, Any]]:
        return Call("GET", f"/v1/pools/{name}", check)

    @staticmethod
    def key_limits(name: str) -> Call[dict[str, Any]]:
        """A pool's limits per concurrency key (admin)."""
        return Call("GET", f"/v1/pools/{name}/key-limits", check)

    @staticmethod
    def set_key_limits(name: str, *, default: int | None = None,
                       keys: Mapping[str, int] | None = None) -> Call[dict[str, Any]]:
        """A pool's key limits become exactly these (admin): `default` every
        key's (None: unlimited), `keys` a key's own."""
        return Call("PUT", f"/v1/pools/{name}/key-limits", check,
                    json={"default": default, "keys": dict(keys or {})})

    @staticmethod
    def upsert_pool(name: str, settings: Mapping[str, Any]) -> Call[dict[str, Any]]:
        return Call("PUT", f"/v1/pools/{name}", check, json=dict(settings))


class Batches:
    """Submit runs in batches of `chunk` (at most 1,000), one request each,
    each batch all or nothing; runs in the order given. Each run is a single
    submit's body as a dict (`input`, `pool`, `labels`, `run_at`, ...) plus
    its `idempotency_key`: with keys, a retry after a failure submits only
    what is missing. `on_chunk(n)` is called after each batch with its size."""

    # submit_many of both clients: each sends the calls this yields and hands
    # their answers to took(); this docstring is theirs.

    def __init__(self, calls: Calls, runs: Iterable[Mapping[str, Any]], chunk: int,
                 on_chunk: Callable[[int], None] | None) -> None:
        self.calls, self.runs, self.chunk, self.on_chunk = calls, runs, chunk, on_chunk
        self.made: builtins.list[RunView] = []
        self.size = 0

    def __iter__(self) -> Iterator[Call[builtins.list[RunView]]]:
        """Each batch's call; the client sends it and hands its answer to took()."""
        for part in chunks(self.runs, self.chunk):
            self.size = len(part)
            yield self.calls.submit_batch(part)

    def took(self, batch: builtins.list[RunView]) -> None:
        self.made += batch
        if self.on_chunk is not None:
            self.on_chunk(self.size)


class Waiting:
    """wait()'s polling: until the run is finished, backing off to 2 s;
    TimeoutError after timeout_s."""

    def __init__(self, run_id: UUID | str, timeout_s: float) -> None:
        self.run_id, self.timeout_s = run_id, timeout_s
        self.deadline, self.delay = time.monotonic() + timeout_s, 0.1

    def next_delay(self, run: RunView) -> float:
        """The wait before the next poll of an unfinished run."""
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"run {self.run_id} still {run.status} after {self.timeout_s} s")
        delay, self.delay = self.delay, min(2.0, self.delay * 1.5)
        return delay


def _current_traceparent() -> str | None:
    """The caller's current OpenTelemetry span as a traceparent header, so
    the run's spans join the caller's trace. Read only when the caller's
    program imported OpenTelemetry already: a client that traces nothing
    imports nothing for it."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
