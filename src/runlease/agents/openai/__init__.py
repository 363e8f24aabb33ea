"""The OpenAI-compatible agent: a model -> tool calls -> results loop.

    {"messages": [{"role": "user", "content": "Which Python is installed?"}],
     "model": "gpt-4o-mini",        # optional, else RUNLEASE_OPENAI_MODEL
     "tools": ["shell", "sleep"],   # optional: the built-in tools offered (none by default)
     "max_tokens": 1024}            # optional

It speaks Chat Completions with `stream: true` through the `openai` package
(`pip install 'runlease[openai]'`) to any compatible endpoint (OpenAI, vLLM,
llama.cpp, Ollama, LiteLLM, ...). Durability: the completed
assistant message of turn N is the step `turn-N`, the result of each tool
call the step `tool-<tool_call_id>`; a re-claimed run rebuilds the
conversation from those, so the model is not asked again for a turn it
already answered and no tool runs twice. Tool calls run only once the
model's message is complete: a stream that breaks half-way executes nothing
and the whole turn is asked again on the next attempt.

Messages sent to the run while it works (POST /v1/runs/{id}/messages, a
thread's `steer`) join the conversation as user messages before the next
model turn; a final answer with messages waiting gets one more turn.

Settings are read when a run starts, not at import, so importing the module
needs no key and tests can point it elsewhere: RUNLEASE_OPENAI_BASE_URL,
RUNLEASE_OPENAI_MODEL, RUNLEASE_OPENAI_API_KEY (or OPENAI_API_KEY) and
RUNLEASE_OPENAI_READ_TIMEOUT_S, from the environment the worker started with
(the worker takes its secrets out of os.environ at start: worker/toolenv.py).
The key goes into the Authorization header only (none is sent without one):
tools never get it (their environment is built by the worker from an
allowlist), and it is scrubbed
from everything the agent stores (events, step results, errors), on top of
the store's own redaction, which cannot know a key of any shape.

    HTTP 429, 5xx, a broken connection or stream -> RetryableError model_unavailable
    any other refusal (4xx)                       -> FatalError model_rejected
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

try:
    # Checked here, in one line: the worker imports its agent at start.
    import openai
except ImportError:
    raise ImportError("the openai agent speaks through the openai package, which is not "
                      "installed: pip install 'runlease[openai]'") from None

from runlease.agents.openai.request import ChatRequest, OpenAISettings, _settings, parse_request
from runlease.agents.openai.scrub import Secrets
from runlease.agents.openai.tools import tool_call
from runlease.agents.openai.turn import model_client, model_turn
from runlease.worker import RunContext

__all__ = ["agent"]


async def agent(ctx: RunContext) -> dict[str, Any]:
    config = _settings()
    request = parse_request(ctx.input, config)
    secrets = Secrets(config.openai_api_key)
    messages = list(request.messages)
    async with model_client(config) as client:
        return await _loop(ctx, client, config, request, messages, secrets)


async def _loop(ctx: RunContext, client: openai.AsyncOpenAI, config: OpenAISettings,
                request: ChatRequest, messages: list[dict[str, Any]],
                secrets: Secrets) -> dict[str, Any]:
    tool_calls = 0
    while True:
        await _take_messages(ctx, messages)
        turn = await ctx.begin_turn()
        reply = await ctx.step(f"turn-{turn}", partial(
            model_turn, ctx, client, config, request, list(messages), turn, secrets))
        message = reply["message"]
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            if await _take_messages(ctx, messages):
                continue  # told something while it answered: one more turn for it
            return {"content": message.get("content") or "", "turns": turn,
                    "tool_calls": tool_calls, "finish_reason": reply["finish_reason"]}
        # Only now, with the message complete and committed, do tools run.
        for call in calls:
            key = f"tool-{call['id']}"
            if await ctx.has_step(key):
                # Replayed turns count against max_turns (begin_turn is outside
                # the step); replayed tool calls must count the same way, or a
                # run could exceed max_tool_calls across attempts.
                ctx.count_tool_call()
            result = await ctx.step(key, partial(tool_call, ctx, request.tools, call, secrets))
            tool_calls += 1
            # Sorted keys: a replayed result comes back from jsonb in its own
            # key order, and the conversation must read the same on every attempt.
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": json.dumps(result, ensure_ascii=False, sort_keys=True)})


async def _take_messages(ctx: RunContext, messages: list[dict[str, Any]]) -> int:
    """Messages sent to the run since its last turn (POST /v1/runs/{id}/messages,
    a thread's `steer`), as user messages: the model sees them at its next turn."""
    taken = await ctx.take_messages()
    for m in taken:
        messages.append({"role": "user", "content": str(m.get("text", ""))})
    return len(taken)
