"""The built-in tools a run may offer the model (shell, sleep), and one tool
call executed as a durable step's body."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runlease.agents.openai.scrub import Secrets
from runlease.worker import RunContext, ToolTimeout

OUTPUT_KEEP_CHARS = 4096  # of each of stdout and stderr, per tool call
EVENT_TEXT_CHARS = 8192  # 4 bytes a character at worst stays well inside the 64 KiB event bound
SHELL_TIMEOUT_S = 120.0
SHELL_TIMEOUT_MAX_S = 3600.0
SLEEP_MAX_S = 3600.0


async def tool_call(
    ctx: RunContext, offered: tuple[str, ...], call: Mapping[str, Any], secrets: Secrets
) -> dict[str, Any]:
    """Execute one tool call (the step's body); failures the model can act on
    are results, not exceptions."""
    name = call["function"]["name"]
    raw = call["function"]["arguments"]
    try:
        arguments: Any = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        arguments = None
        problem = f"the arguments are not valid JSON: {exc}"
    else:
        problem = "" if isinstance(arguments, dict) else "the arguments must be a JSON object"
    # Arguments can be a whole file for the shell to write: events stay small.
    shown = arguments if isinstance(arguments, dict) and len(raw) <= EVENT_TEXT_CHARS \
        else raw[:EVENT_TEXT_CHARS]
    await ctx.emit("tool.call", secrets.scrub_json({"id": call["id"], "name": name,
                                                    "arguments": shown}))
    tool = TOOLS.get(name) if name in offered else None
    if tool is None:
        ctx.count_tool_call()
        result: dict[str, Any] = {"error": f"unknown tool {name[:100]!r}; "
                                           f"tools offered: {', '.join(offered) or 'none'}"}
    elif problem:
        ctx.count_tool_call()
        result = {"error": problem}
    else:
        result = await tool.run(ctx, arguments, secrets)
    result = secrets.scrub_json(result)
    await ctx.emit("tool.result", {"id": call["id"], "name": name, "result": result})
    return result


@dataclass(frozen=True)
class Tool:
    schema: dict[str, Any]
    run: Callable[[RunContext, dict[str, Any], Secrets], Awaitable[dict[str, Any]]]


def _function(name: str, description: str, properties: dict[str, Any],
              required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


async def _shell(ctx: RunContext, args: dict[str, Any], secrets: Secrets) -> dict[str, Any]:
    argv = args.get("argv")
    timeout_s = args.get("timeout_s", SHELL_TIMEOUT_S)
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        ctx.count_tool_call()
        return {"error": "argv must be a non-empty list of strings"}
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        ctx.count_tool_call()
        return {"error": "timeout_s must be a positive number of seconds"}
    timeout_s = min(float(timeout_s), SHELL_TIMEOUT_MAX_S)
    try:
        result = await ctx.run_tool(argv, timeout_s=timeout_s)
    except ToolTimeout:
        return {"error": f"{argv[0]} ran over its timeout of {timeout_s:g} s and was stopped"}
    except OSError as exc:  # not found, not executable
        return {"error": f"could not start {argv[0]}: {exc.strerror or exc}"}
    return {"returncode": result.returncode, "stdout": _tail(result.stdout),
            "stderr": _tail(result.stderr)}


async def _sleep(ctx: RunContext, args: dict[str, Any], secrets: Secrets) -> dict[str, Any]:
    ctx.count_tool_call()
    seconds = args.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        return {"error": "seconds must be a number >= 0"}
    seconds = min(float(seconds), SLEEP_MAX_S)
    await ctx.sleep(seconds)
    return {"slept_s": seconds}


def _tail(text: str) -> str:
    if len(text) <= OUTPUT_KEEP_CHARS:
        return text
    return f"[... {len(text) - OUTPUT_KEEP_CHARS} characters cut ...]\n" + \
        text[-OUTPUT_KEEP_CHARS:]


TOOLS: dict[str, Tool] = {
    "shell": Tool(_function(
        "shell", "Run a command on the worker and get its exit code, stdout and stderr "
                 "(the last 4 KB of each). argv is executed directly: use "
                 "[\"sh\", \"-c\", \"...\"] for pipes and redirections.",
        {"argv": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                  "description": "The program and its arguments."},
         "timeout_s": {"type": "number",
                       "description": f"Stop the command after this many seconds "
                                      f"(default {SHELL_TIMEOUT_S:g}, at most "
                                      f"{SHELL_TIMEOUT_MAX_S:g})."}},
        ["argv"]), _shell),
    "sleep": Tool(_function(
        "sleep", "Wait for a number of seconds.",
        {"seconds": {"type": "number", "minimum": 0,
                     "description": f"How long to wait (at most {SLEEP_MAX_S:g})."}},
        ["seconds"]), _sleep),
}
