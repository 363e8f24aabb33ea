"""Each client method is declared once (`sends`) for both clients: on Client
it answers, on AsyncClient it is a coroutine, and help() shows the call's
own parameters and docstring."""

from __future__ import annotations

import asyncio
import inspect

import httpx

from runlease.client import AsyncClient, Client


def _answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"secret": f"{request.method} {request.url.path}"})


def test_the_same_declaration_answers_on_client_and_is_a_coroutine_on_async_client() -> None:
    sync = Client("http://api.test", transport=httpx.MockTransport(_answer))
    assert sync.webhook_secret(rotate=True) == "POST /v1/webhook-secret/rotate"
    assert not inspect.iscoroutinefunction(Client.webhook_secret)
    assert inspect.iscoroutinefunction(AsyncClient.webhook_secret)
    assert inspect.iscoroutinefunction(AsyncClient.bulk_cancel)
    assert inspect.iscoroutinefunction(AsyncClient.pause_schedule)


async def _async_secret() -> str:
    async with AsyncClient("http://api.test", transport=httpx.MockTransport(_answer)) as api:
        return await api.webhook_secret()


def test_async_client_sends_the_call() -> None:
    assert asyncio.run(_async_secret()) == "GET /v1/webhook-secret"


def test_help_shows_the_calls_parameters_and_docstring() -> None:
    api = Client("http://api.test")
    assert [*inspect.signature(api.submit).parameters][:2] == ["input", "pool"]
    assert [*inspect.signature(Client.get).parameters] == ["self", "run_id"]
    assert [*inspect.signature(api.create_schedule).parameters][:3] == [
        "name", "cron", "template"]
    assert "Cancel the runs" in (api.bulk_cancel.__doc__ or "")
    assert api.bulk_cancel.__name__ == "bulk_cancel"
