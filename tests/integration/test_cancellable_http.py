"""ctx.http (worker/cancellable_http.py) against a slow local stream: a cancel
of the run closes a response being read, whether it came from
`ctx.http.stream` or from another client's stream handed to `closes`."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from runlease.worker import RunCancelled
from runlease.worker.cancellable_http import CancellableHttp
from tests.support.fake_openai import FakeOpenAI, Reply
from tests.support.waiting import until

SLOW = Reply(content="word " * 200, chunk_chars=5, delay_s=0.2)  # ~40 s of stream
BODY = {"model": "m", "messages": [], "stream": True}


async def hung_up(fake: FakeOpenAI) -> bool:
    return bool(fake.hangups)


async def read_cancelling(http: CancellableHttp, url: str) -> None:
    """Read the stream; cancel the run at its first line."""
    async with http.stream("POST", url, json=BODY) as response:
        async for _ in response.aiter_lines():
            http.cancel.set()


async def read_other_cancelling(http: CancellableHttp, response: httpx.Response) -> None:
    async with http.closes(response.aclose):
        async for _ in response.aiter_lines():
            http.cancel.set()


async def test_a_cancel_closes_a_stream_of_ctx_http() -> None:
    cancel = asyncio.Event()
    http = CancellableHttp(cancel)
    async with FakeOpenAI() as fake:
        fake.script(SLOW)
        with pytest.raises(RunCancelled):
            await read_cancelling(http, f"{fake.base_url}/chat/completions")
        await until(lambda: hung_up(fake), timeout_s=5, what="the stream to be closed")
    await http.aclose()


async def test_closes_ends_another_clients_stream_on_cancel() -> None:
    cancel = asyncio.Event()
    http = CancellableHttp(cancel)
    async with FakeOpenAI() as fake, httpx.AsyncClient() as other:
        fake.script(SLOW)
        request = other.build_request("POST", f"{fake.base_url}/chat/completions", json=BODY)
        response = await http.race(other.send(request, stream=True))
        with pytest.raises(RunCancelled):
            await read_other_cancelling(http, response)
        await until(lambda: hung_up(fake), timeout_s=5, what="the stream to be closed")
    await http.aclose()


async def test_race_ends_a_request_still_waiting_for_its_answer() -> None:
    cancel = asyncio.Event()
    http = CancellableHttp(cancel)
    never = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(cancel.set)
    with pytest.raises(RunCancelled):
        await http.race(never)
    assert never.cancelled()
