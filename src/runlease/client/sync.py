"""The synchronous client: sends the calls `calls.py` declares."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Self
from uuid import UUID

import httpx

from runlease.client.actions import Actions
from runlease.client.calls import MAX_BATCH, Batches, Call, Calls, T, Waiting, check, sends
from runlease.client.errors import ApiError
from runlease.client.run_methods import RunMethods
from runlease.client.schedules import Schedules
from runlease.client.sse import Resume, RunEnded, StreamEvent
from runlease.client.views import RunView


class Client(RunMethods, Actions, Schedules):
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

    def submit_many(self, runs: Iterable[Mapping[str, Any]], *, chunk: int = MAX_BATCH,
                    on_chunk: Callable[[int], None] | None = None) -> builtins.list[RunView]:
        batches = Batches(self._calls, runs, chunk, on_chunk)
        for call in batches:
            batches.took(self._send(call))
        return batches.made

    submit_many.__doc__ = Batches.__doc__

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
        after RunEnded. When the API cannot be reached at all (its first
        connection fails), raises httpx.TransportError at once."""
        resume = Resume(run_id, after, max_reconnects)
        while True:
            error: Exception | None = None
            try:
                with self._http.stream(**self._calls.events(run_id, resume.after,
                                                            read_timeout_s)) as r:
                    resume.answered = True
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

    stream_token = sends(Calls.stream_token)

    # -- admin ----------------------------------------------------------------------------

    pools = sends(Calls.pools)
    pool = sends(Calls.pool)

    def upsert_pool(self, name: str, **settings: Any) -> dict[str, Any]:
        """PUT the pool: settings left out take their defaults (see pool())."""
        return self._send(self._calls.upsert_pool(name, settings))
