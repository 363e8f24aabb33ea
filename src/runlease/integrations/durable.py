"""What the library adapters share: the model endpoint's settings, one model
request as a durable step with its text streamed, one tool call as a durable
step, and the run's inbox taken at the same points on every attempt.

Each library has its own objects (the Agents SDK's ModelResponse, PydanticAI's
ModelResponse); the adapters turn them into JSON for the step and back, and
use these helpers for the rest, so the events, step keys and error mapping
are the same as the built-in OpenAI agent's (runlease.agents.openai):

    model-<n>          the n-th model request of the attempt's flow (replayed ones included)
    tool-<n>-<call id> a tool call the model asked for in request n
    inbox-<n>          how many messages the run had taken when request n's run ended

Events: `message.delta` (the streamed text), `message` (a model's text,
once complete), `tool.call` and `tool.result`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import openai
from pydantic_core import to_jsonable_python

from runlease.agents.openai.failures import outcome
from runlease.agents.openai.scrub import Secrets, StreamScrubber
from runlease.agents.openai.tools import EVENT_TEXT_CHARS
from runlease.agents.openai.usage import _count
from runlease.integrations.running import bind
from runlease.worker import FatalError, RunCancelled, RunContext
from runlease.worker.toolenv import worker_environ

T = TypeVar("T")

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
CONNECT_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 300.0
DELTA_CHARS = 2048
KEY_ID_CHARS = 200  # a step key stays within 255 characters


@dataclass(frozen=True)
class ModelEnv:
    """The model endpoint, from the environment the worker started with:
    RUNLEASE_OPENAI_BASE_URL or OPENAI_BASE_URL, RUNLEASE_OPENAI_API_KEY or
    OPENAI_API_KEY, RUNLEASE_OPENAI_MODEL (the model when the agent names none)."""

    base_url: str
    api_key: str | None
    model: str
    read_timeout_s: float = READ_TIMEOUT_S

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> ModelEnv:
        env = worker_environ() if environ is None else environ
        base_url = (env.get("RUNLEASE_OPENAI_BASE_URL") or env.get("OPENAI_BASE_URL")
                    or DEFAULT_BASE_URL)
        if not base_url.startswith(("http://", "https://")):
            raise FatalError(f"the model's base URL must be an http(s) URL, got {base_url!r}",
                             code="agent_misconfigured")
        key = env.get("RUNLEASE_OPENAI_API_KEY") or env.get("OPENAI_API_KEY") or None
        try:
            read_timeout_s = float(env.get("RUNLEASE_OPENAI_READ_TIMEOUT_S") or READ_TIMEOUT_S)
        except ValueError:
            raise FatalError("RUNLEASE_OPENAI_READ_TIMEOUT_S must be a number of seconds",
                             code="agent_misconfigured") from None
        return cls(base_url, key, env.get("RUNLEASE_OPENAI_MODEL") or DEFAULT_MODEL,
                   max(1.0, read_timeout_s))

    def client(self) -> openai.AsyncOpenAI:
        """No retries of its own: a failed request ends the attempt, and the
        queue retries it with its backoff, fenced."""
        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key or "unused", max_retries=0,
            timeout=openai.Timeout(CONNECT_TIMEOUT_S, read=self.read_timeout_s))

    @property
    def secrets(self) -> Secrets:
        return Secrets(self.api_key)


def call_key(call_id: str) -> str:
    """A tool call id fit for a step key (long or odd ids are hashed)."""
    if call_id and len(call_id) <= KEY_ID_CHARS and call_id.isprintable():
        return call_id
    return "h" + hashlib.sha256(call_id.encode()).hexdigest()[:32]


def jsonable(value: Any) -> Any:
    """A library's value as JSON for a step or an event: pydantic models,
    dataclasses and the like dumped as pydantic dumps them (JSON mode), what
    it cannot dump as its str()."""
    return to_jsonable_python(value, fallback=str)


class Flow:
    """One attempt's walk through a run: the count of model requests, the
    inbox, the tool calls. Replayed requests count like new ones, so the
    n-th request has the same key on every attempt."""

    def __init__(self, ctx: RunContext, secrets: Secrets) -> None:
        self.ctx = ctx
        # The run's tasks (the library's, its tools') see it as run_context().
        bind(ctx)
        self.secrets = secrets
        self.requests = 0
        self.taken = 0  # messages taken by this attempt, replayed ones included
        self.call_turn: dict[str, int] = {}  # tool call id -> the request that asked for it
        # Messages given to the model as user input: (where in the library's
        # history, the messages), put back into every later request there.
        self.injected: list[tuple[int, list[Any]]] = []

    def with_messages(self, history: list[Any], messages: list[Any]) -> list[Any]:
        """The library's history for a request, with the messages taken for
        it and for the requests before it in their places."""
        if messages:
            self.injected.append((len(history), messages))
        return self.history(history)

    def history(self, items: list[Any]) -> list[Any]:
        out = list(items)
        for at, messages in reversed(self.injected):
            out[at:at] = messages
        return out

    async def begin_request(self) -> tuple[int, list[dict[str, Any]], dict[str, Any] | None]:
        """Count a model turn (max_turns) and take the messages sent since the
        last one; returns (n, messages, the committed step or None). A replayed
        request takes exactly the messages it took the first time."""
        n = await self.ctx.begin_turn()
        self.requests = n
        key = f"model-{n}"
        if await self.ctx.has_step(key):
            stored: dict[str, Any] = await self.ctx.step(key, _never)
            return n, await self._take(int(stored.get("inbox", self.taken)) - self.taken), stored
        return n, await self._take(None), None

    async def model_step(self, n: int, request: Callable[[], Awaitable[dict[str, Any]]],
                         failure: Callable[[Exception], Exception | None] | None = None,
                         ) -> dict[str, Any]:
        """Request n as a durable step: `request` streams and returns the
        response as JSON; the step keeps it with the inbox count. `failure`
        maps the library's own errors (else the openai package's are mapped:
        retryable model_unavailable, fatal model_rejected), key scrubbed."""
        async def body() -> dict[str, Any]:
            try:
                response = await self.ctx.http.race(request())
            except Exception as exc:
                if self.ctx.cancelled:
                    raise RunCancelled("the run was cancelled during a model call") from None
                mapped = failure(exc) if failure is not None else None
                if mapped is not None:
                    raise mapped from None
                if isinstance(exc, openai.OpenAIError):
                    raise outcome(exc, self.secrets) from None
                raise
            return {**self.secrets.scrub_json(response), "inbox": self.taken}
        return await self.ctx.step(f"model-{n}", body)

    async def after_run(self) -> list[dict[str, Any]]:
        """Messages that came while the library's run gave its final answer
        (the step `inbox-<n>` keeps how many, for the replay)."""
        key = f"inbox-{self.requests}"
        if await self.ctx.has_step(key):
            count: int = await self.ctx.step(key, _never)
            return await self._take(int(count) - self.taken)
        messages = await self._take(None)
        taken = self.taken

        async def taken_so_far() -> int:
            return taken
        await self.ctx.step(key, taken_so_far)
        return messages

    async def _take(self, want: int | None) -> list[dict[str, Any]]:
        if want is not None and want <= 0:
            return []
        taken = await self.ctx.take_messages(*(() if want is None else (want,)))
        self.taken += len(taken)
        return taken

    # -- text and usage of a request ------------------------------------------------

    def stream(self) -> TextStream:
        return TextStream(self.ctx, self.secrets.stream())

    async def finished(self, n: int, text: str, input_tokens: object,
                       output_tokens: object) -> None:
        """A request's end: its usage recorded (max_tokens), its text shown."""
        counts = {"i": input_tokens, "o": output_tokens}
        inp, out = _count(counts, "i"), _count(counts, "o")
        if inp or out:
            await self.ctx.record_usage(input_tokens=inp, output_tokens=out)
        if text:
            text = self.secrets.scrub(text)
            await self.ctx.emit("message", {"role": "assistant",
                                            "content": text[:EVENT_TEXT_CHARS], "turn": n,
                                            "truncated": len(text) > EVENT_TEXT_CHARS})

    # -- tools ------------------------------------------------------------------------------

    async def tool_call(self, call_id: str, name: str, arguments: Any,
                        invoke: Callable[[], Awaitable[Any]]) -> Any:
        """One tool call as the step `tool-<n>-<id>`: run once, its result
        (as JSON) replayed after that. Counts against max_tool_calls."""
        self.ctx.count_tool_call()
        turn = self.call_turn.get(call_id, self.requests)
        key = f"tool-{turn}-{call_key(call_id)}"

        async def body() -> dict[str, Any]:
            shown = arguments
            if isinstance(shown, str):
                with contextlib.suppress(ValueError):
                    shown = json.loads(shown) if len(shown) <= EVENT_TEXT_CHARS else shown
            if isinstance(shown, str):
                shown = shown[:EVENT_TEXT_CHARS]
            await self.ctx.emit("tool.call", self.secrets.scrub_json(
                {"id": call_id, "name": name, "arguments": jsonable(shown)}))
            result = self.secrets.scrub_json(jsonable(await self.ctx.http.race(invoke())))
            await self.ctx.emit("tool.result", {"id": call_id, "name": name, "result": result})
            return {"output": result}
        stored = await self.ctx.step(key, body)
        return stored["output"]


class TextStream:
    """A request's streamed text, as message.delta events, scrubbed of the key."""

    def __init__(self, ctx: RunContext, scrubber: StreamScrubber) -> None:
        self.ctx = ctx
        self.scrubber = scrubber
        self.parts: list[str] = []

    async def add(self, text: str) -> None:
        self.parts.append(text)
        await self._send(self.scrubber.feed(text.replace("\x00", "\ufffd")))

    async def end(self) -> str:
        await self._send(self.scrubber.end())
        return "".join(self.parts)

    async def _send(self, text: str) -> None:
        for start in range(0, len(text), DELTA_CHARS):
            await self.ctx.delta(text[start:start + DELTA_CHARS])


async def _never() -> Any:
    raise AssertionError("a committed step was asked to run again")


def check_keys(value: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    """A run's input names only what the adapter reads (a typo is refused,
    not ignored)."""
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise FatalError(f"input: unknown key {unknown[0][:100]!r}; this agent reads "
                         f"{', '.join(allowed)}", code="bad_input")


def texts(messages: list[dict[str, Any]]) -> list[str]:
    """The text of each message taken from the run's inbox."""
    return [str(m.get("text", "")) for m in messages]
