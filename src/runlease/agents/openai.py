"""The OpenAI-compatible agent: a model -> tool calls -> results loop.

    {"messages": [{"role": "user", "content": "Which Python is installed?"}],
     "model": "gpt-4o-mini",        # optional, else RUNLEASE_OPENAI_MODEL
     "tools": ["shell", "sleep"],   # optional: the built-in tools offered (none by default)
     "max_tokens": 1024}            # optional

It speaks Chat Completions with `stream: true` to any compatible endpoint
(OpenAI, vLLM, llama.cpp, Ollama, LiteLLM, ...). Durability: the completed
assistant message of turn N is the step `turn-N`, the result of each tool
call the step `tool-<tool_call_id>`; a re-claimed run rebuilds the
conversation from those, so the model is not asked again for a turn it
already answered and no tool runs twice. Tool calls run only once the
model's message is complete: a stream that breaks half-way executes nothing
and the whole turn is asked again on the next attempt.

Settings are read when a run starts, not at import, so importing the module
needs no key and tests can point it elsewhere: RUNLEASE_OPENAI_BASE_URL,
RUNLEASE_OPENAI_MODEL, RUNLEASE_OPENAI_API_KEY (or OPENAI_API_KEY) and
RUNLEASE_OPENAI_READ_TIMEOUT_S, from the environment the worker started with
(the worker takes its secrets out of os.environ at start: worker/toolenv.py).
The key goes into the Authorization header only: tools never get it (their
environment is built by the worker from an allowlist), and it is scrubbed
from everything the agent stores (events, step results, errors), on top of
the store's own redaction, which cannot know a key of any shape.

    HTTP 429, 5xx, a broken connection or stream -> RetryableError model_unavailable
    any other refusal (4xx, a redirect)           -> FatalError model_rejected
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx

from runlease.errors import SettingsError
from runlease.settings import load, setting
from runlease.worker import FatalError, RetryableError, RunCancelled, RunContext, ToolTimeout
from runlease.worker.toolenv import worker_environ

UNAVAILABLE = "model_unavailable"
REJECTED = "model_rejected"
MASK = "[REDACTED]"

OUTPUT_KEEP_CHARS = 4096  # of each of stdout and stderr, per tool call
EVENT_TEXT_CHARS = 8192  # 4 bytes a character at worst stays well inside the 64 KiB event bound
DELTA_CHARS = 2048  # ctx.delta stores what it is given in one event; keep pieces small
ERROR_BODY_CHARS = 500
SHELL_TIMEOUT_S = 120.0
SHELL_TIMEOUT_MAX_S = 3600.0
SLEEP_MAX_S = 3600.0
CALL_ID_MAX_CHARS = 200  # the step key `tool-<id>` must stay within 255 characters


@dataclass(frozen=True)
class OpenAISettings:
    openai_base_url: str = setting("https://api.openai.com/v1",
                                   "Base URL of the Chat Completions API (up to /v1).")
    openai_model: str = setting("gpt-4o-mini", "Model asked when the run's input names none.")
    openai_api_key: str | None = setting(None, "API key, sent as a bearer token.",
                                         env=("OPENAI_API_KEY",))
    openai_read_timeout_s: float = setting(
        300.0, "Longest silence allowed while the model streams (reasoning models can "
               "think for minutes before the first token).", minimum=1)

    def check(self) -> None:
        try:
            url = httpx.URL(self.openai_base_url)
        except httpx.InvalidURL as exc:
            raise SettingsError(f"RUNLEASE_OPENAI_BASE_URL is not a URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise SettingsError("RUNLEASE_OPENAI_BASE_URL must be an http(s) URL with a host, "
                                f"got {self.openai_base_url!r}")

    @property
    def completions_url(self) -> str:
        return self.openai_base_url.rstrip("/") + "/chat/completions"


@dataclass(frozen=True)
class ChatRequest:
    """What one run asks for, validated before the first model call."""

    messages: list[dict[str, Any]]
    model: str
    tools: tuple[str, ...]
    max_tokens: int | None


# -- the loop -----------------------------------------------------------------------


async def agent(ctx: RunContext) -> dict[str, Any]:
    config = _settings()
    request = _request(ctx.input, config)
    secrets = _Secrets(config.openai_api_key)
    messages = list(request.messages)
    tool_calls = 0
    while True:
        turn = await ctx.begin_turn()
        reply = await ctx.step(f"turn-{turn}", partial(
            _model_turn, ctx, config, request, list(messages), turn, secrets))
        message = reply["message"]
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
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
            result = await ctx.step(key, partial(_tool_call, ctx, request, call, secrets))
            tool_calls += 1
            # Sorted keys: a replayed result comes back from jsonb in its own
            # key order, and the conversation must read the same on every attempt.
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": json.dumps(result, ensure_ascii=False, sort_keys=True)})


def _settings() -> OpenAISettings:
    try:
        return load(OpenAISettings, environ=worker_environ())
    except SettingsError as exc:
        # Dead rather than retried: every attempt on this worker would fail
        # the same way, and a dead run can be redriven once the worker is fixed.
        raise FatalError(f"the openai agent is misconfigured: {exc}",
                         code="agent_misconfigured") from None


def _request(value: Mapping[str, Any], config: OpenAISettings) -> ChatRequest:
    messages = value.get("messages")
    if (not isinstance(messages, list) or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
        raise FatalError("input.messages must be a non-empty list of chat messages "
                         "(objects with a role)", code="bad_input")
    model = value.get("model", config.openai_model)
    if not isinstance(model, str) or not model:
        raise FatalError("input.model must be a non-empty string", code="bad_input")
    tools = value.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise FatalError("input.tools must be a list of tool names", code="bad_input")
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        raise FatalError(f"input.tools: unknown tool {unknown[0]!r}; built-in tools: "
                         f"{', '.join(sorted(TOOLS))}", code="bad_input")
    max_tokens = value.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 1):
        raise FatalError("input.max_tokens must be a positive integer", code="bad_input")
    return ChatRequest(messages, model, tuple(dict.fromkeys(tools)), max_tokens)


# -- one model turn -------------------------------------------------------------------


async def _model_turn(
    ctx: RunContext, config: OpenAISettings, request: ChatRequest, messages: list[dict[str, Any]],
    turn: int, secrets: _Secrets,
) -> dict[str, Any]:
    """Stream one completion; return the finished assistant message (the step's result)."""
    body: dict[str, Any] = {"model": request.model, "messages": messages, "stream": True}
    if request.tools:
        body["tools"] = [TOOLS[name].schema for name in request.tools]
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    headers = {"Accept": "text/event-stream"}
    if config.openai_api_key:
        headers["Authorization"] = f"Bearer {config.openai_api_key}"
    reply = _Reply()
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
    message = secrets.scrub_json(reply.message(_used_call_ids(messages), turn))
    if message["content"] or "tool_calls" not in message:
        text = message["content"] or ""
        await ctx.emit("message", {"role": "assistant", "content": text[:EVENT_TEXT_CHARS],
                                   "turn": turn, "truncated": len(text) > EVENT_TEXT_CHARS})
    return {"message": message, "finish_reason": reply.finish_reason}


async def _check_status(response: httpx.Response, secrets: _Secrets) -> None:
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
    response: httpx.Response, reply: _Reply, secrets: _Secrets,
    show: Callable[[str], Awaitable[None]],
) -> None:
    events = _EventParser()
    async for line in response.aiter_lines():
        if await _take(events.feed(line), reply, secrets, show):
            return
    await _take(events.feed(""), reply, secrets, show)  # a last event without its blank line


async def _take(data: str | None, reply: _Reply, secrets: _Secrets,
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


def _json(raw: bytes, secrets: _Secrets) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RetryableError(secrets.scrub(
            f"the model API sent something that is not a JSON object: {raw[:200]!r}"),
            code=UNAVAILABLE)
    return value


class _EventParser:
    """Server-sent events, line by line: the data of each event, or None."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        if not line:  # a blank line ends an event
            data, self._data = self._data, []
            return "\n".join(data) if data else None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None  # comments (":..."), event:, id:, retry: carry nothing we use


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _Reply:
    """A streamed assistant message put back together from its deltas."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.finish_reason: str | None = None
        self.done = False

    @property
    def complete(self) -> bool:
        # [DONE] is the protocol's end; a few servers stop after the chunk
        # with finish_reason instead, which is as complete.
        return self.done or self.finish_reason is not None

    def add(self, chunk: Mapping[str, Any]) -> str:
        """Take one chunk (or a whole non-streamed completion); return its new text."""
        text = ""
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # we never ask for n > 1
            delta = choice.get("delta") or choice.get("message") or {}
            if isinstance(delta.get("content"), str):
                text += delta["content"]
            parts = delta.get("tool_calls")
            for position, part in enumerate(parts if isinstance(parts, list) else []):
                if isinstance(part, dict):
                    self._add_call(position, part)
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
        text = text.replace("\x00", "\ufffd")  # jsonb refuses NUL, and deltas are stored
        self.content.append(text)
        return text

    def _add_call(self, position: int, part: Mapping[str, Any]) -> None:
        index = part.get("index")
        call = self.calls.setdefault(index if isinstance(index, int) else position, _Call())
        function = part.get("function") or {}
        # id and name are taken once: some servers repeat them on every fragment.
        if not call.id and isinstance(part.get("id"), str):
            call.id = part["id"]
        if not call.name and isinstance(function.get("name"), str):
            call.name = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments.append(arguments)
        elif isinstance(arguments, dict):  # a server that sends parsed arguments
            call.arguments.append(json.dumps(arguments))

    def message(self, used_ids: set[str], turn: int) -> dict[str, Any]:
        content = "".join(self.content)
        calls = []
        for position, index in enumerate(sorted(self.calls)):
            call = self.calls[index]
            call_id = call.id
            # The id names a durable step, so it must be unique within the run;
            # some servers send none, or "call_0" on every turn.
            if (not call_id or call_id in used_ids or len(call_id) > CALL_ID_MAX_CHARS
                    or not call_id.isprintable()):
                call_id = f"call_t{turn}_{position}"
            used_ids.add(call_id)
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": call.name,
                                       "arguments": "".join(call.arguments)}})
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = calls
        else:
            message["content"] = content
        return message


def _used_call_ids(messages: Sequence[Mapping[str, Any]]) -> set[str]:
    used: set[str] = set()
    for message in messages:
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                used.add(call["id"])
    return used


# -- tools ------------------------------------------------------------------------------


async def _tool_call(
    ctx: RunContext, request: ChatRequest, call: Mapping[str, Any], secrets: _Secrets
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
    tool = TOOLS.get(name) if name in request.tools else None
    if tool is None:
        ctx.count_tool_call()
        offered = ", ".join(request.tools) or "none"
        result: dict[str, Any] = {"error": f"unknown tool {name[:100]!r}; "
                                           f"tools offered: {offered}"}
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
    run: Callable[[RunContext, dict[str, Any], _Secrets], Awaitable[dict[str, Any]]]


def _function(name: str, description: str, properties: dict[str, Any],
              required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


async def _shell(ctx: RunContext, args: dict[str, Any], secrets: _Secrets) -> dict[str, Any]:
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


async def _sleep(ctx: RunContext, args: dict[str, Any], secrets: _Secrets) -> dict[str, Any]:
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


# -- keeping the key out of what is stored ---------------------------------------------------


class _Secrets:
    """Makes text fit to store: the key masked, and NUL (which jsonb refuses,
    and which binary tool output has plenty of) replaced."""

    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key or None

    def scrub(self, text: str) -> str:
        if self.api_key:
            text = text.replace(self.api_key, MASK)
        return text.replace("\x00", "\ufffd")

    def scrub_json(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {self.scrub(str(k)): self.scrub_json(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub_json(v) for v in value]
        return value

    def stream(self) -> _StreamScrubber:
        return _StreamScrubber(self.api_key)


class _StreamScrubber:
    """Scrubs the key from text that arrives in pieces, where a key can be
    split across two deltas: the tail that could begin a key is held back
    until the next piece (or the end) shows whether it does."""

    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key
        self.held = ""

    def feed(self, text: str) -> str:
        if not self.api_key:
            return text
        text = (self.held + text).replace(self.api_key, MASK)
        longest = min(len(text), len(self.api_key) - 1)
        keep = next((n for n in range(longest, 0, -1) if self.api_key.startswith(text[-n:])), 0)
        self.held = text[len(text) - keep:]
        return text[:len(text) - keep]

    def end(self) -> str:
        held, self.held = self.held, ""
        return held
