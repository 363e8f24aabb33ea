"""The worker, and the API agent code is written against.

    from runlease.worker import RunContext, RetryableError, FatalError
"""

from runlease.worker.context import RunContext
from runlease.worker.errors import (
    BudgetExceeded,
    FatalError,
    InputTimeout,
    RetryableError,
    RunCancelled,
    ToolTimeout,
)
from runlease.worker.tools import ToolResult

__all__ = [
    "BudgetExceeded",
    "FatalError",
    "InputTimeout",
    "RetryableError",
    "RunCancelled",
    "RunContext",
    "ToolResult",
    "ToolTimeout",
]
