"""The openai agent's reading of what the `openai` package hands it: its
exceptions as retryable or fatal outcomes (key scrubbed), and a streamed
reply put back together, usage included when the server sends it."""

from __future__ import annotations

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from runlease.agents.openai.failures import outcome
from runlease.agents.openai.reply import Reply
from runlease.agents.openai.scrub import Secrets
from runlease.worker import FatalError, RetryableError

KEY = "rlk-unit-0123456789abcdef"
REQUEST = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


def status_error(status: int, message: str, **headers: str) -> openai.APIStatusError:
    response = httpx2.Response(status, request=REQUEST, headers=headers)
    kinds: dict[int, type[openai.APIStatusError]] = {
        400: openai.BadRequestError, 401: openai.AuthenticationError,
        429: openai.RateLimitError, 503: openai.InternalServerError}
    return kinds.get(status, openai.APIStatusError)(
        f"Error code: {status}", response=response, body={"message": message})


@pytest.mark.parametrize(("status", "kind"), [
    (429, RetryableError), (500, RetryableError), (503, RetryableError),
    (400, FatalError), (401, FatalError), (403, FatalError), (404, FatalError),
])
def test_status_errors_are_retryable_only_when_a_later_attempt_may_pass(
        status: int, kind: type[Exception]) -> None:
    result = outcome(status_error(status, f"no: {KEY}"), Secrets(KEY))
    assert type(result) is kind
    assert str(result) == f"model API answered HTTP {status}: no: [REDACTED]"
    assert result.code == ("model_unavailable" if kind is RetryableError
                           else "model_rejected")


def test_retry_after_is_honoured() -> None:
    result = outcome(status_error(429, "slow down", **{"retry-after": "7"}), Secrets(None))
    assert isinstance(result, RetryableError)
    assert result.retry_after_s == 7.0


@pytest.mark.parametrize("exc", [
    openai.APIConnectionError(request=REQUEST),
    openai.APITimeoutError(request=REQUEST),
    openai.APIError("the model crashed", REQUEST, body={"message": "the model crashed"}),
])
def test_no_answer_or_a_broken_stream_is_retryable(exc: openai.OpenAIError) -> None:
    result = outcome(exc, Secrets(None))
    assert isinstance(result, RetryableError)
    assert result.code == "model_unavailable"


def test_a_reply_keeps_its_usage_when_the_server_sends_it() -> None:
    reply = Reply()
    reply.add(ChatCompletionChunk.construct(**{
        "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
        "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}))
    assert reply.complete
    assert reply.usage == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    assert reply.message(set(), 1) == {"role": "assistant", "content": "hi"}
