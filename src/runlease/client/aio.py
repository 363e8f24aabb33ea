"""The asynchronous client, for agent platforms running on asyncio."""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import AsyncIterator, Mapping
from datetime import date
from typing import Any, Self
from uuid import UUID

import httpx

from runlease.client.calls import Calls
from runlease.client.errors import ApiError
from runlease.client.sse import Resume, RunEnded, SseParser, StreamEvent
from runlease.client.views import RunPage, RunView, StepPage


class AsyncClient:
    """Asynchronous client, for agent platforms running on asyncio."""

    def __init__(self, api_url: str, token: str | None = None, *, timeout_s: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._calls = Calls(api_url, token)
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
                     tenant_id: str | None = None,
                     parent_run_id: UUID | str | None = None,
                     webhook_url: str | None = None) -> RunView:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = await self._http.post("/v1/runs", headers=headers,
                                         json=self._calls.submit_body(
                                             input, pool, priority, max_attempts, budget,
                                             tenant_id, parent_run_id, webhook_url))
        return RunView.from_json(self._calls.check(response), response.status_code == 201)

    async def get(self, run_id: UUID | str) -> RunView:
        return RunView.from_json(await self._call("GET", f"/v1/runs/{run_id}"))

    async def list(self, *, status: str | None = None, pool: str | None = None,
                   limit: int = 50, cursor: str | None = None,
                   parent_run_id: UUID | str | None = None) -> RunPage:
        return self._calls.page(await self._call(
            "GET", "/v1/runs", params=self._calls.list_params(status, pool, limit, cursor,
                                                              parent_run_id)))

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
        resume = Resume(run_id, after, max_reconnects)
        while True:
            parser = SseParser()
            error: Exception | None = None
            try:
                async with self._http.stream(
                        "GET", f"/v1/runs/{run_id}/events",
                        headers=self._calls.stream_headers(resume.after),
                        timeout=httpx.Timeout(10.0, read=read_timeout_s)) as r:
                    if r.status_code >= 400:
                        await r.aread()
                        self._calls.check(r)
                    async for line in r.aiter_lines():
                        item = parser.feed(line)
                        if item is not None:
                            yield item
                            if resume.seen(item):
                                return
            except (httpx.TransportError, ApiError) as exc:
                error = exc
            await asyncio.sleep(resume.dropped(error))

    async def dead_letters(self, *, pool: str | None = None, limit: int = 50,
                           cursor: str | None = None) -> RunPage:
        return self._calls.page(await self._call(
            "GET", "/v1/dead-letters", params=self._calls.list_params(None, pool, limit, cursor)))

    async def redrive(self, run_id: UUID | str) -> RunView:
        return RunView.from_json(await self._call("POST", f"/v1/runs/{run_id}/redrive"))

    async def usage(self, *, start: date | str | None = None, end: date | str | None = None,
                    group_by: str = "day", tenant_id: str | None = None,
                    pool: str | None = None) -> dict[str, Any]:
        """Usage (tokens, cost) from `start` to `end` (UTC days, inclusive),
        grouped by "tenant", "pool" or "day": GET /v1/usage's JSON."""
        params = self._calls.usage_params(start, end, group_by, tenant_id, pool)
        result: dict[str, Any] = await self._call("GET", "/v1/usage", params=params)
        return result

    async def webhook(self, run_id: UUID | str) -> dict[str, Any]:
        """The run's webhook delivery: {url, state, tries, attempts, ...}."""
        result: dict[str, Any] = await self._call("GET", f"/v1/runs/{run_id}/webhook")
        return result

    async def webhook_hosts(self, hosts: builtins.list[dict[str, Any]] | None = None
                            ) -> dict[str, Any]:
        """The webhook allowlist (admin): {hosts: [{host, allow_private}]}; with
        `hosts`, make it exactly those first."""
        if hosts is None:
            got: dict[str, Any] = await self._call("GET", "/v1/webhook-hosts")
        else:
            got = await self._call("PUT", "/v1/webhook-hosts", json={"hosts": hosts})
        return got

    async def webhook_secret(self, *, rotate: bool = False,
                       tenant_id: str | None = None) -> str:
        """The key that signs the tenant's deliveries (a new one with rotate)."""
        path = "/v1/webhook-secret/rotate" if rotate else "/v1/webhook-secret"
        got: dict[str, Any] = await self._call("POST" if rotate else "GET", path,
                                           params={"tenant_id": tenant_id} if tenant_id else {})
        return str(got["secret"])
