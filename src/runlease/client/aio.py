"""The asynchronous client, for agent platforms running on asyncio: sends the
calls `calls.py` declares."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Self
from uuid import UUID

import httpx

from runlease.client.actions import Actions
from runlease.client.calls import MAX_BATCH, Batches, Call, Calls, T, Waiting, check
from runlease.client.errors import ApiError
from runlease.client.run_methods import RunMethods
from runlease.client.schedules import Schedules
from runlease.client.sse import Resume, RunEnded, StreamEvent
from runlease.client.views import RunView


class AsyncClient(RunMethods, Actions, Schedules):
    """Asynchronous client, for agent platforms running on asyncio."""

    def __init__(self, api_url: str, token: str | None = None, *, timeout_s: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._calls = Calls(api_url, token)
        self._http = httpx.AsyncClient(**self._calls.http_options(timeout_s, transport))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call[T]) -> T:
        return call.read(await self._http.send(call.request(self._http)))

    async def submit_many(self, runs: Iterable[Mapping[str, Any]], *, chunk: int = MAX_BATCH,
                    on_chunk: Callable[[int], None] | None = None) -> builtins.list[RunView]:
        batches = Batches(self._calls, runs, chunk, on_chunk)
        for call in batches:
            batches.took(await self._send(call))
        return batches.made

    submit_many.__doc__ = Batches.__doc__

    async def wait(self, run_id: UUID | str, *, timeout_s: float = 300.0) -> RunView:
        waiting = Waiting(run_id, timeout_s)
        while True:
            run = await self.get(run_id)
            if run.finished:
                return run
            await asyncio.sleep(waiting.next_delay(run))

    async def events(self, run_id: UUID | str, *, after: int = 0,
                     max_reconnects: int | None = None,
                     read_timeout_s: float = 60.0) -> AsyncIterator[StreamEvent | RunEnded]:
        resume = Resume(run_id, after, max_reconnects)
        while True:
            error: Exception | None = None
            try:
                async with self._http.stream(**self._calls.events(run_id, resume.after,
                                                                  read_timeout_s)) as r:
                    resume.answered = True
                    if r.status_code >= 400:
                        await r.aread()
                        check(r)
                    async for line in r.aiter_lines():
                        for item in resume.take(line):
                            yield item
                        if resume.ended:
                            return
            except (httpx.TransportError, ApiError) as exc:
                error = exc
            await asyncio.sleep(resume.dropped(error))
