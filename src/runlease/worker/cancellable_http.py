"""An HTTP client for agent code whose requests end when the run is cancelled.

A model API streaming tokens can hold a response open for minutes; a Stop
must close it, not wait for it. Requests and streams made through this
helper race the run's cancel token: when it is set, the response is closed
and the agent sees RunCancelled. `race` and `closes` do the same for a
request made by any other client (an SDK's): the wait for its answer, and
the reading of its stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx

from runlease.worker.errors import RunCancelled

T = TypeVar("T")

# What reading a response raises once it was closed under it.
_CLOSED_UNDER_IT = (httpx.StreamClosed, httpx.ReadError, httpx.RemoteProtocolError)


class CancellableHttp:
    def __init__(self, cancel: asyncio.Event, *, read_timeout_s: float = 600.0) -> None:
        self.cancel = cancel
        # A model may think for minutes before its first token: a generous read
        # timeout; connecting, writing and pooling should be quick.
        self.timeout = httpx.Timeout(10.0, read=read_timeout_s)
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        return self._client

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return await self.race(self.client.request(method, url, **kwargs))

    async def race(self, work: Awaitable[T]) -> T:
        """`work` (a request, of this client or an SDK's) awaited, or ended
        with RunCancelled as soon as the run is cancelled."""
        if self.cancel.is_set():
            raise RunCancelled("the run was cancelled")
        call = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self.cancel.wait())
        try:
            done, _ = await asyncio.wait({call, stop}, return_when=asyncio.FIRST_COMPLETED)
            if call in done:
                return call.result()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await call
            raise RunCancelled("the run was cancelled during an HTTP request")
        finally:
            stop.cancel()
            if not call.done():
                call.cancel()

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        """`async with ctx.http.stream("POST", url, json=...) as response:`; the
        response is closed as soon as the run is cancelled."""
        if self.cancel.is_set():
            raise RunCancelled("the run was cancelled")
        async with self.client.stream(method, url, **kwargs) as response, \
                self.closes(response.aclose, _CLOSED_UNDER_IT):
            yield response

    @contextlib.asynccontextmanager
    async def closes(self, close: Callable[[], Awaitable[object]],
                     closed_under_it: tuple[type[Exception], ...] = (Exception,),
                     ) -> AsyncIterator[None]:
        """While the block reads a streamed response (this client's, or an
        SDK's stream), a cancel of the run calls `close`: the read in progress
        ends at once, and the block with RunCancelled. What the read raises
        then (`closed_under_it`) becomes RunCancelled too."""
        if self.cancel.is_set():
            raise RunCancelled("the run was cancelled")

        async def close_on_cancel() -> None:
            await self.cancel.wait()
            await close()

        watcher = asyncio.create_task(close_on_cancel(), name="http-cancel-watch")
        try:
            yield
        except closed_under_it:
            if self.cancel.is_set():
                raise RunCancelled("the run was cancelled during a streamed response") from None
            raise
        finally:
            watcher.cancel()
        if self.cancel.is_set():
            raise RunCancelled("the run was cancelled during a streamed response")

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
