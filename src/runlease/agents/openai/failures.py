"""The `openai` package's exceptions as the worker's outcomes: what a later
attempt may get past is retryable, what it would only repeat is fatal.

    429, 5xx, no connection, a timeout, a broken stream -> RetryableError model_unavailable
    any other refusal (4xx)                             -> FatalError model_rejected

Every message is scrubbed of the API key: a refusal may quote it back.
"""

from __future__ import annotations

import openai

from runlease.agents.openai.scrub import Secrets
from runlease.worker import FatalError, RetryableError

UNAVAILABLE = "model_unavailable"
REJECTED = "model_rejected"
ERROR_BODY_CHARS = 500


def outcome(exc: openai.OpenAIError, secrets: Secrets) -> RetryableError | FatalError:
    """The error a failed model call ends its attempt with."""
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = secrets.scrub(f"model API answered HTTP {status}: {_detail(exc)}")
        if status == 429 or status >= 500:
            return RetryableError(message, code=UNAVAILABLE,
                                  retry_after_s=_retry_after(exc.response.headers.get(
                                      "retry-after")))
        return FatalError(message, code=REJECTED)
    if isinstance(exc, openai.APIConnectionError):  # APITimeoutError too
        cause = exc.__cause__ or exc
        return RetryableError(secrets.scrub(
            f"model API unreachable: {type(cause).__name__}: {cause}"), code=UNAVAILABLE)
    if isinstance(exc, openai.APIError):
        # Some servers report a failure inside a 200 stream.
        return RetryableError(secrets.scrub(
            f"the model's stream failed: {_body_message(exc.body, exc.message)}"[:1000]),
            code=UNAVAILABLE)
    # The client refused before sending anything: every attempt would too.
    return FatalError(secrets.scrub(f"the model client failed: {exc}"), code=REJECTED)


def not_json(raw: object, secrets: Secrets) -> RetryableError:
    """What a confused server (or a misrouted base URL) sent instead of a chunk."""
    shown = repr(raw)[:200]
    return RetryableError(secrets.scrub(
        f"the model API sent something that is not a JSON object: {shown}"), code=UNAVAILABLE)


def _detail(exc: openai.APIStatusError) -> str:
    """The error answer's message, else its text, else the status's reason."""
    text = _body_message(exc.body, exc.response.text)
    return text[:ERROR_BODY_CHARS].strip() or exc.response.reason_phrase


def _body_message(body: object, otherwise: str) -> str:
    # openai hands over the answer's `error` object when it has one.
    if isinstance(body, dict):
        return str(body.get("message", body))
    return body if isinstance(body, str) else otherwise


def _retry_after(header: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare from model APIs)."""
    try:
        return max(0.0, float(header)) if header else None
    except ValueError:
        return None
