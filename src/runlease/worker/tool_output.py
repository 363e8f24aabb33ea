"""A tool's output as run events, while it runs (`runs tail` shows it live).

The store redacts each event alone, so output is cut into events only where
no secret can straddle two of them: each stream goes through a
StreamHoldback (core/redact.py), which hands out text up to a safe cut
(after whitespace, outside a key block or a `Bearer `/`Cookie:` region) and
holds the rest until more output, or the end of the tool, completes it. A
piece longer than one event is redacted whole before it is split. Each tool
call streams at most `max_bytes`; past that one `truncated` note says how
much was left out (the step's own result keeps the output's tail).
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping
from typing import Any

from runlease.core.redact import DEFAULT_REDACTOR, Redactor
from runlease.core.redact_stream import StreamHoldback

EVENT_MAX_CHARS = 16 * 1024
STREAM_MAX_BYTES = 64 * 1024


class OutputEvents:
    """Turns (stream, bytes) chunks into (kind, data) events. Not async: fed
    from the tool's pipe readers, drained by the run's writer."""

    def __init__(self, kind: str, data: Mapping[str, Any] | None = None, *,
                 max_bytes: int = STREAM_MAX_BYTES,
                 redactor: Redactor = DEFAULT_REDACTOR) -> None:
        self.kind = kind
        self.data = dict(data or {})
        self.max_bytes = max_bytes
        self.redactor = redactor
        self.seen = 0
        self.dropped = 0
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self._holds: dict[str, StreamHoldback] = {}
        self._pieces: list[tuple[str, str]] = []

    def feed(self, stream: str, chunk: bytes) -> None:
        room = max(0, self.max_bytes - self.seen)
        self.seen += len(chunk)
        if len(chunk) > room:
            self.dropped += len(chunk) - room
            chunk = chunk[:room]
        if not chunk:
            return
        if stream not in self._decoders:
            self._decoders[stream] = codecs.getincrementaldecoder("utf-8")(errors="replace")
            self._holds[stream] = StreamHoldback(self.redactor)
        text = self._decoders[stream].decode(chunk).replace("\0", "\ufffd")  # jsonb has no NUL
        self._add(stream, self._holds[stream].feed(text))

    def _add(self, stream: str, text: str) -> None:
        if not text:
            return
        if self._pieces and self._pieces[-1][0] == stream:
            text = self._pieces.pop()[1] + text
        if len(text) > EVENT_MAX_CHARS:
            # Cut below: redact the whole first, so a secret cut in two is
            # already masked.
            text = self.redactor.text(text)
        while len(text) > EVENT_MAX_CHARS:
            cut = max(text.rfind(" ", 0, EVENT_MAX_CHARS),
                      text.rfind("\n", 0, EVENT_MAX_CHARS)) + 1 or EVENT_MAX_CHARS
            self._pieces.append((stream, text[:cut]))
            text = text[cut:]
        self._pieces.append((stream, text))

    @property
    def pending(self) -> bool:
        return bool(self._pieces)

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        """The events of the output that is safe to store so far."""
        pieces, self._pieces = self._pieces, []
        return [(self.kind, {**self.data, "stream": s, "text": t}) for s, t in pieces]

    def finish(self) -> list[tuple[str, dict[str, Any]]]:
        """The rest, once the tool has ended: what was held, and the note."""
        for stream, decoder in self._decoders.items():
            hold = self._holds[stream]
            rest = decoder.decode(b"", final=True).replace("\0", "\ufffd")
            self._add(stream, hold.feed(rest) + hold.end())
        events = self.take()
        if self.dropped:
            events.append((self.kind, {**self.data, "stream": "note", "truncated": True,
                                       "text": f"[output over {self.max_bytes} bytes: "
                                               f"{self.dropped} more bytes not shown]\n"}))
        return events


def text_pieces(text: str, size: int) -> list[str]:
    """text in pieces of at most size characters, each ending after the last
    whitespace in it when there is one."""
    pieces = []
    while len(text) > size:
        cut = max(text.rfind(" ", 0, size), text.rfind("\n", 0, size)) + 1 or size
        pieces.append(text[:cut])
        text = text[cut:]
    pieces.append(text)
    return pieces
