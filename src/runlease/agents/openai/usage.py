"""A completion's `usage` (prompt and completion tokens) reported to the run
with ctx.record_usage, which sums it over attempts and enforces max_tokens.

The server's answer is hostile input: a count that is not a whole number in
bounds is left out (logged), never passed on to fail the run's write.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from runlease.core.bounds import USAGE_TOKENS_MAX
from runlease.worker import RunContext

log = logging.getLogger(__name__)

# Ask for the usage chunk at the end of a stream (OpenAI's stream_options).
STREAM_OPTIONS = {"include_usage": True}


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= USAGE_TOKENS_MAX:
        log.warning("model_usage_ignored key=%s value=%.40r", key, value)
        return 0
    return value


async def record_model_usage(ctx: RunContext, usage: object) -> None:
    """Record one completion's usage, if the server sent any."""
    if not isinstance(usage, Mapping):
        return
    prompt, completion = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
    if prompt or completion:
        await ctx.record_usage(input_tokens=prompt, output_tokens=completion)
