"""One model turn: a streamed completion over HTTP, its failures mapped to
retryable or fatal errors, its text shown as deltas."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from runlease.agents.openai.reply import EventParser, Reply, used_call_ids
from runlease.agents.openai.request import ChatRequest, OpenAISettings
from runlease.agents.openai.scrub import Secrets
from runlease.agents.openai.tools import EVENT_TEXT_CHARS, TOOLS
from runlease.agents.openai.usage import STREAM_OPTIONS, record_model_usage
from runlease.worker import FatalError, RetryableError, RunCancelled, RunContext

UNAVAILABLE = "model_unavailable"
REJECTED = "model_rejected"
DELTA_CHARS = 2048  # ctx.delta stores what it is given in one event; keep pieces small
ERROR_BODY_CHARS = 500


async def model_turn(
    ctx: RunContext, config: OpenAISettings, request: ChatRequest, messages: list[dict[str, Any]],
    turn: int, secrets: Secrets,
) -> dict[str, Any]:
    """Stream one completion; return the finished assistant message (the step's result)."""
    body: dict[str, Any] = {"model": request.model, "messages": messages, "stream": True,
                            "stream_options": STREAM_OPTIONS}
    if request.tools:
        body["tools"] = [TOOLS[name].schema for name in request.tools]
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    headers = {"Accept": "text/event-stream"}
    if config.openai_api_key:
        headers["Authorization"] = f"Bearer {config.openai_api_key}"
    reply = Reply()
    scrubber = secrets.stream()

    async def show(text: str) -> None:
        await _stream_text(ctx, scrubber.feed(text))

    try:
        async with ctx.http.stream(
            "POST", config.completions_url, json=body, headers=headers,
            timeout=httpx.Timeout(30.0, read=config.openai_read_timeout_s),
        ) as response:
            await _check_status(response, secrets)
            if response.headers.get("content-type", "").startswith("application/json"):
                # The server ignored `stream: true` and answered in one piece.
                await show(reply.add(_json(await response.aread(), secrets)))
                reply.done = True
            else:
                await _read_events(response, reply, secrets, show)
    except httpx.HTTPError as exc:
        if ctx.cancelled:
            raise RunCancelled("the run was cancelled during a model call") from None
        raise RetryableError(secrets.scrub(f"model API unreachable: {type(exc).__name__}: {exc}"),
                             code=UNAVAILABLE) from None
    if not reply.complete:
        raise RetryableError("the model's stream ended before its message was complete",
                             code=UNAVAILABLE)
    await _stream_text(ctx, scrubber.end())
    await record_model_usage(ctx, reply.usage)  # may end the run: max_tokens
    message = secrets.scrub_json(reply.message(used_call_ids(messages), turn))
    if message["content"] or "tool_calls" not in message:
        text = message["content"] or ""
        await ctx.emit("message", {"role": "assistant", "content": text[:EVENT_TEXT_CHARS],
                                   "turn": turn, "truncated": len(text) > EVENT_TEXT_CHARS})
    return {"message": message, "finish_reason": reply.finish_reason}


async def _check_status(response: httpx.Response, secrets: Secrets) -> None:
    status = response.status_code
    if 200 <= status < 300:
        return
    detail = await _error_detail(response)
    message = secrets.scrub(f"model API answered HTTP {status}: {detail}")
    if status == 429 or status >= 500:
        raise RetryableError(message, code=UNAVAILABLE,
                             retry_after_s=_retry_after(response.headers.get("retry-after")))
    raise FatalError(message, code=REJECTED)


def _retry_after(header: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare from model APIs)."""
    try:
        return max(0.0, float(header)) if header else None
    except ValueError:
        return None


async def _error_detail(response: httpx.Response) -> str:
    raw = bytearray()
    # An error body is small, but a misrouted base URL can stream anything back.
    async for chunk in response.aiter_bytes():
        raw += chunk
        if len(raw) > 16 * 1024:
            break
    text = raw.decode(errors="replace")
    try:
        error = json.loads(text)["error"]
        text = str(error.get("message", error) if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        pass
    return text[:ERROR_BODY_CHARS].strip() or response.reason_phrase


async def _read_events(
    response: httpx.Response, reply: Reply, secrets: Secrets,
    show: Callable[[str], Awaitable[None]],
) -> None:
    events = EventParser()
    async for line in response.aiter_lines():
        if await _take(events.feed(line), reply, secrets, show):
            return
    await _take(events.feed(""), reply, secrets, show)  # a last event without its blank line


async def _take(data: str | None, reply: Reply, secrets: Secrets,
                show: Callable[[str], Awaitable[None]]) -> bool:
    """One event's data into the reply; True once the stream says it is done."""
    if data is None:
        return False
    if data.strip() == "[DONE]":
        reply.done = True
        return True
    chunk = _json(data.encode(), secrets)
    error = chunk.get("error")
    if error:
        # Some servers report a failure inside a 200 stream.
        detail = error.get("message", error) if isinstance(error, dict) else error
        raise RetryableError(secrets.scrub(f"the model's stream failed: {detail}"[:1000]),
                             code=UNAVAILABLE)
    await show(reply.add(chunk))
    return False


async def _stream_text(ctx: RunContext, text: str) -> None:
    for start in range(0, len(text), DELTA_CHARS):
        await ctx.delta(text[start:start + DELTA_CHARS])


def _json(raw: bytes, secrets: Secrets) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RetryableError(secrets.scrub(
            f"the model API sent something that is not a JSON object: {raw[:200]!r}"),
            code=UNAVAILABLE)
    return value
