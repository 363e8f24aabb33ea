"""What agent code raises to say how a run ended (besides returning).

    return value          -> ack (done, the value stored as the result)
    RetryableError        -> nack: retried with backoff, dead at max_attempts
    any other exception   -> nack, error_code "unexpected"
    FatalError            -> dead at once
    BudgetExceeded        -> dead, error_code "budget_exceeded"
    RunCancelled          -> the user's Stop was seen: cancelled, never retried
    InputTimeout          -> (from ctx.wait_for_input, uncaught) dead, "input_timeout"
"""

from __future__ import annotations

from runlease.core.states import ErrorCode
from runlease.errors import RunleaseError


class RetryableError(RunleaseError):
    """A failure worth another attempt (a flaky model API, a timeout).

    `retry_after_s` (a 429's Retry-After, say) delays the next attempt at
    least that long; the backoff applies when it is longer."""

    default_code: str = ErrorCode.RETRYABLE.value

    def __init__(self, message: str, *, code: str | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code = code or self.default_code
        self.retry_after_s = retry_after_s


class FatalError(RunleaseError):
    """A failure no retry will fix (bad input, a refused request)."""

    default_code: str = ErrorCode.FATAL.value

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code or self.default_code


class BudgetExceeded(FatalError):
    default_code = ErrorCode.BUDGET_EXCEEDED.value


class ToolTimeout(RetryableError):
    default_code = ErrorCode.TOOL_TIMEOUT.value


class RunCancelled(RunleaseError):
    """Raised inside agent code once the user asked to stop the run."""


class InputTimeout(FatalError):
    """ctx.wait_for_input's request timed out with no answer. The agent may
    catch it (and go on without); uncaught, the run ends dead with
    error_code input_timeout."""

    default_code = ErrorCode.INPUT_TIMEOUT.value

    def __init__(self, name: str) -> None:
        super().__init__(f"no answer to input {name!r} before its timeout")
        self.name = name
