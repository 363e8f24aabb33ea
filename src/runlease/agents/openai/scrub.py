"""Keeping the API key out of what the agent stores, whole or streamed."""

from __future__ import annotations

from typing import Any

MASK = "[REDACTED]"


class Secrets:
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

    def stream(self) -> StreamScrubber:
        return StreamScrubber(self.api_key)


class StreamScrubber:
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
