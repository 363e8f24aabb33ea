"""The asynchronous client, for agent platforms running on asyncio: sends the
calls `calls.py` declares."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Self
from uuid import UUID

import httpx

from runlease.client.calls import MAX_BATCH, Call, Calls, T, Waiting, check, chunks
from runlease.client.errors import ApiError
from runlease.client.sse import Resume, RunEnded, StreamEvent
from runlease.client.views import RunPage, RunView, StepPage


class AsyncClient:
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

    async def submit(self, input: Mapping[str, Any], *, pool: str | None = None,  # noqa: A002
               priority: int | None = None, max_attempts: int | None = None,
               budget: Mapping[str, Any] | None = None, idempotency_key: str | None = None,
               tenant_id: str | None = None, labels: Mapping[str, str] | None = None,
               run_at: datetime | str | None = None, delay_s: float | None = None) -> RunView:
        """Enqueue a run; `labels` to find it by, `run_at` or `delay_s` to start it later."""
        return await self._send(self._calls.submit(input, pool, priority, max_attempts, budget,
                                             idempotency_key, tenant_id, labels, run_at,
                                             delay_s))

    async def submit_many(self, runs: Iterable[Mapping[str, Any]], *, chunk: int = MAX_BATCH,
                    on_chunk: Callable[[int], None] | None = None) -> builtins.list[RunView]:
        """Submit runs in batches of `chunk` (at most 1,000), one request each,
        each batch all or nothing; runs in the order given. Each run is a single
        submit's body as a dict (`input`, `pool`, `labels`, `run_at`, ...) plus
        its `idempotency_key`: with keys, a retry after a failure submits only
        what is missing. `on_chunk(n)` is called after each batch with its size."""
        made: builtins.list[RunView] = []
        for part in chunks(runs, chunk):
            batch: builtins.list[RunView] = await self._send(self._calls.submit_batch(part))
            made += batch
            if on_chunk is not None:
                on_chunk(len(part))
        return made

    async def get(self, run_id: UUID | str) -> RunView:
        return await self._send(self._calls.get(run_id))

    async def list(self, *, status: str | Sequence[str] | None = None, pool: str | None = None,
             limit: int = 50, cursor: str | None = None,
             label: Sequence[str] | Mapping[str, str] | None = None,
             created_after: datetime | None = None, created_before: datetime | None = None,
             finished_after: datetime | None = None, finished_before: datetime | None = None,
             idempotency_key: str | None = None, tenant: str | None = None) -> RunPage:
        """A page of runs, newest first, filtered (every filter given must match:
        any of `status`, all of `label` as "key:value" or a dict)."""
        return await self._send(self._calls.list(
            status, pool, limit, cursor, label=label, created_after=created_after,
            created_before=created_before, finished_after=finished_after,
            finished_before=finished_before, idempotency_key=idempotency_key, tenant=tenant))

    async def cancel(self, run_id: UUID | str) -> RunView:
        return await self._send(self._calls.cancel(run_id))

    async def steps(self, run_id: UUID | str, *, limit: int = 20,
                    cursor: str | None = None) -> StepPage:
        """A page of the run's committed steps, in step-key order."""
        return await self._send(self._calls.steps(run_id, limit, cursor))

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

    async def dead_letters(self, *, pool: str | None = None, limit: int = 50,
                           cursor: str | None = None) -> RunPage:
        return await self._send(self._calls.dead_letters(pool, limit, cursor))

    async def redrive(self, run_id: UUID | str) -> RunView:
        return await self._send(self._calls.redrive(run_id))
