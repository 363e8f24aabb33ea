"""The synchronous client: sends the calls `calls.py` declares."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Self
from uuid import UUID

import httpx

from runlease.client.calls import MAX_BATCH, Call, Calls, T, Waiting, check, chunks
from runlease.client.errors import ApiError
from runlease.client.sse import Resume, RunEnded, StreamEvent
from runlease.client.views import RunPage, RunView, StepPage


class Client:
    """Synchronous client."""

    def __init__(self, api_url: str, token: str | None = None, *, timeout_s: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._calls = Calls(api_url, token)
        self._http = httpx.Client(**self._calls.http_options(timeout_s, transport))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call[T]) -> T:
        return call.read(self._http.send(call.request(self._http)))

    def submit(self, input: Mapping[str, Any], *, pool: str | None = None,  # noqa: A002
               priority: int | None = None, max_attempts: int | None = None,
               budget: Mapping[str, Any] | None = None, idempotency_key: str | None = None,
               tenant_id: str | None = None, labels: Mapping[str, str] | None = None,
               run_at: datetime | str | None = None, delay_s: float | None = None) -> RunView:
        """Enqueue a run; `labels` to find it by, `run_at` or `delay_s` to start it later."""
        return self._send(self._calls.submit(input, pool, priority, max_attempts, budget,
                                             idempotency_key, tenant_id, labels, run_at,
                                             delay_s))

    def submit_many(self, runs: Iterable[Mapping[str, Any]], *, chunk: int = MAX_BATCH,
                    on_chunk: Callable[[int], None] | None = None) -> builtins.list[RunView]:
        """Submit runs in batches of `chunk` (at most 1,000), one request each,
        each batch all or nothing; runs in the order given. Each run is a single
        submit's body as a dict (`input`, `pool`, `labels`, `run_at`, ...) plus
        its `idempotency_key`: with keys, a retry after a failure submits only
        what is missing. `on_chunk(n)` is called after each batch with its size."""
        made: builtins.list[RunView] = []
        for part in chunks(runs, chunk):
            batch: builtins.list[RunView] = self._send(self._calls.submit_batch(part))
            made += batch
            if on_chunk is not None:
                on_chunk(len(part))
        return made

    def get(self, run_id: UUID | str) -> RunView:
        return self._send(self._calls.get(run_id))

    def list(self, *, status: str | Sequence[str] | None = None, pool: str | None = None,
             limit: int = 50, cursor: str | None = None,
             label: Sequence[str] | Mapping[str, str] | None = None,
             created_after: datetime | None = None, created_before: datetime | None = None,
             finished_after: datetime | None = None, finished_before: datetime | None = None,
             idempotency_key: str | None = None, tenant: str | None = None) -> RunPage:
        """A page of runs, newest first, filtered (every filter given must match:
        any of `status`, all of `label` as "key:value" or a dict)."""
        return self._send(self._calls.list(
            status, pool, limit, cursor, label=label, created_after=created_after,
            created_before=created_before, finished_after=finished_after,
            finished_before=finished_before, idempotency_key=idempotency_key, tenant=tenant))

    def cancel(self, run_id: UUID | str) -> RunView:
        return self._send(self._calls.cancel(run_id))

    def steps(self, run_id: UUID | str, *, limit: int = 20,
              cursor: str | None = None) -> StepPage:
        """A page of the run's committed steps, in step-key order."""
        return self._send(self._calls.steps(run_id, limit, cursor))

    def wait(self, run_id: UUID | str, *, timeout_s: float = 300.0) -> RunView:
        """Poll until the run is finished (done, dead or cancelled)."""
        waiting = Waiting(run_id, timeout_s)
        while True:
            run = self.get(run_id)
            if run.finished:
                return run
            time.sleep(waiting.next_delay(run))

    def events(self, run_id: UUID | str, *, after: int = 0, max_reconnects: int | None = None,
               read_timeout_s: float = 60.0) -> Iterator[StreamEvent | RunEnded]:
        """The run's events, live; reconnects with Last-Event-ID after a drop
        (or a 502, 503 or 504 answer), so nothing is lost or repeated; ends
        after RunEnded."""
        resume = Resume(run_id, after, max_reconnects)
        while True:
            error: Exception | None = None
            try:
                with self._http.stream(**self._calls.events(run_id, resume.after,
                                                            read_timeout_s)) as r:
                    if r.status_code >= 400:
                        r.read()
                        check(r)
                    for line in r.iter_lines():
                        yield from resume.take(line)
                        if resume.ended:
                            return
            except (httpx.TransportError, ApiError) as exc:
                error = exc
            time.sleep(resume.dropped(error))

    def stream_token(self, run_id: UUID | str) -> dict[str, Any]:
        return self._send(self._calls.stream_token(run_id))

    # -- admin ----------------------------------------------------------------------------

    def dead_letters(self, *, pool: str | None = None, limit: int = 50,
                     cursor: str | None = None) -> RunPage:
        return self._send(self._calls.dead_letters(pool, limit, cursor))

    def redrive(self, run_id: UUID | str) -> RunView:
        return self._send(self._calls.redrive(run_id))

    def pools(self) -> builtins.list[dict[str, Any]]:
        return self._send(self._calls.pools())

    def pool(self, name: str) -> dict[str, Any]:
        return self._send(self._calls.pool(name))

    def upsert_pool(self, name: str, **settings: Any) -> dict[str, Any]:
        """PUT the pool: settings left out take their defaults (see pool())."""
        return self._send(self._calls.upsert_pool(name, settings))
