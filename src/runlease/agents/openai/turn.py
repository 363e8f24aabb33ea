"""One model turn: a streamed completion through the `openai` package, its
text shown as deltas, its failures mapped to retryable or fatal errors
(failures.py), and the stream closed at once when the run is cancelled."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from runlease import tracing
from runlease.agents.openai.failures import UNAVAILABLE, not_json, outcome
from runlease.agents.openai.reply import Reply, used_call_ids
from runlease.agents.openai.request import ChatRequest, OpenAISettings
from runlease.agents.openai.scrub import Secrets
from runlease.agents.openai.tools import EVENT_TEXT_CHARS, TOOLS
from runlease.agents.openai.usage import STREAM_OPTIONS, record_model_usage
from runlease.worker import RetryableError, RunCancelled, RunContext

DELTA_CHARS = 2048  # ctx.delta stores what it is given in one event; keep pieces small
CONNECT_TIMEOUT_S = 30.0


def model_client(config: OpenAISettings) -> openai.AsyncOpenAI:
    """The run's client. No retries of its own: a failed call ends the
    attempt, and the queue retries it with its backoff (and fences it)."""
    return openai.AsyncOpenAI(
        base_url=config.openai_base_url,
        # The client wants a key; without one no Authorization header is sent
        # (model_turn omits it), as local servers (llama.cpp, Ollama) expect.
        api_key=config.openai_api_key or "unused",
        max_retries=0,
        timeout=openai.Timeout(CONNECT_TIMEOUT_S, read=config.openai_read_timeout_s),
    )


async def model_turn(
    ctx: RunContext, client: openai.AsyncOpenAI, config: OpenAISettings,
    request: ChatRequest, messages: list[dict[str, Any]], turn: int, secrets: Secrets,
) -> dict[str, Any]:
    """Stream one completion; return the finished assistant message (the step's result).
    While tracing is on, inside a `model.turn` span naming the model and the
    tokens it reported (never the messages)."""
    if not tracing.ENABLED:
        return await _model_turn(ctx, client, config, request, messages, turn, secrets)
    with tracing.span("model.turn", {"gen_ai.request.model": request.model,
                                     "runlease.turn": turn}) as span:
        assert span is not None
        result = await _model_turn(ctx, client, config, request, messages, turn, secrets)
        usage = result.get("usage") or {}
        for key, attribute in (("prompt_tokens", "gen_ai.usage.input_tokens"),
                               ("completion_tokens", "gen_ai.usage.output_tokens")):
            if isinstance(usage.get(key), int):
                span.set_attribute(attribute, usage[key])
        if result.get("finish_reason"):
            span.set_attribute("gen_ai.response.finish_reasons", [str(result["finish_reason"])])
        return result


async def _model_turn(
    ctx: RunContext, client: openai.AsyncOpenAI, config: OpenAISettings,
    request: ChatRequest, messages: list[dict[str, Any]], turn: int, secrets: Secrets,
) -> dict[str, Any]:
    reply = Reply()
    scrubber = secrets.stream()
    try:
        stream = await ctx.http.race(client.chat.completions.create(
            model=request.model, messages=cast(Any, messages), stream=True,
            tools=cast(Any, [TOOLS[name].schema for name in request.tools]) if request.tools
            else openai.omit,
            max_tokens=request.max_tokens if request.max_tokens is not None else openai.omit,
            extra_headers=None if config.openai_api_key else {"Authorization": openai.omit},
            stream_options=cast(Any, STREAM_OPTIONS),
        ))
        async with stream, ctx.http.closes(stream.close):
            async for chunk in _chunks(stream, secrets):
                await _stream_text(ctx, scrubber.feed(reply.add(chunk)))
    except openai.OpenAIError as exc:
        if ctx.cancelled:
            raise RunCancelled("the run was cancelled during a model call") from None
        raise outcome(exc, secrets) from None
    except json.JSONDecodeError as exc:  # an event of the stream that is not JSON
        raise not_json(exc.doc, secrets) from None
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
    result: dict[str, Any] = {"message": message, "finish_reason": reply.finish_reason}
    if reply.usage:
        result["usage"] = reply.usage
    return result


async def _chunks(stream: openai.AsyncStream[ChatCompletionChunk], secrets: Secrets
                  ) -> AsyncIterator[ChatCompletionChunk | ChatCompletion]:
    """The stream's chunks; or, from a server that ignored `stream: true` and
    answered in one piece, that completion."""
    response = stream.response
    if response.headers.get("content-type", "").startswith("application/json"):
        data = json.loads(await response.aread())
        if not isinstance(data, dict):
            raise not_json(data, secrets)
        yield ChatCompletion.construct(**data)
        return
    async for chunk in stream:
        if not isinstance(chunk, ChatCompletionChunk):
            raise not_json(chunk, secrets)
        yield chunk


async def _stream_text(ctx: RunContext, text: str) -> None:
    for start in range(0, len(text), DELTA_CHARS):
        await ctx.delta(text[start:start + DELTA_CHARS])
