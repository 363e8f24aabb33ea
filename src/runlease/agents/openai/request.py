"""The agent's settings and what one run asks for, both checked before the
first model call."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from runlease.agents.openai.tools import TOOLS
from runlease.errors import SettingsError
from runlease.settings import load, setting
from runlease.worker import FatalError
from runlease.worker.toolenv import worker_environ


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


@dataclass(frozen=True)
class ChatRequest:
    """What one run asks for, validated before the first model call."""

    messages: list[dict[str, Any]]
    model: str
    tools: tuple[str, ...]
    max_tokens: int | None


def _settings() -> OpenAISettings:
    try:
        return load(OpenAISettings, environ=worker_environ())
    except SettingsError as exc:
        # Dead rather than retried: every attempt on this worker would fail
        # the same way, and a dead run can be redriven once the worker is fixed.
        raise FatalError(f"the openai agent is misconfigured: {exc}",
                         code="agent_misconfigured") from None


def parse_request(value: Mapping[str, Any], config: OpenAISettings) -> ChatRequest:
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
