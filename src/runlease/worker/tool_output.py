"""A tool's output as run events, while it runs (`runs tail` shows it live).

Output is cut into whole lines before it becomes an event: redaction works on
one event at a time, so a secret split between two events would escape it.
A line longer than LINE_MAX_CHARS is cut anyway (a bound beats a guarantee
for output with no newlines). Each tool call streams at most `max_bytes`;
past that one `truncated` note says how much was left out (the step's own
result keeps the output's tail, as before).
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping
from typing import Any

LINE_MAX_CHARS = 4096
EVENT_MAX_CHARS = 16 * 1024
STREAM_MAX_BYTES = 64 * 1024


class OutputEvents:
    """Turns (stream, bytes) chunks into (kind, data) events. Not async: fed
    from the tool's pipe readers, drained by the run's writer."""

    def __init__(self, kind: str, data: Mapping[str, Any] | None = None, *,
                 max_bytes: int = STREAM_MAX_BYTES) -> None:
        self.kind = kind
        self.data = dict(data or {})
        self.max_bytes = max_bytes
        self.seen = 0
        self.dropped = 0
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self._partial: dict[str, str] = {}
        self._lines: list[tuple[str, str]] = []

    def feed(self, stream: str, chunk: bytes) -> None:
        room = max(0, self.max_bytes - self.seen)
        self.seen += len(chunk)
        if len(chunk) > room:
            self.dropped += len(chunk) - room
            chunk = chunk[:room]
        if not chunk:
            return
        decoder = self._decoders.setdefault(
            stream, codecs.getincrementaldecoder("utf-8")(errors="replace"))
        text = self._partial.pop(stream, "") + decoder.decode(chunk)
        *lines, rest = text.split("\n")
        for line in lines:
            self._add(stream, line + "\n")
        while len(rest) > LINE_MAX_CHARS:
            self._add(stream, rest[:LINE_MAX_CHARS])
            rest = rest[LINE_MAX_CHARS:]
        if rest:
            self._partial[stream] = rest

    def _add(self, stream: str, text: str) -> None:
        if self._lines and self._lines[-1][0] == stream and \
                len(self._lines[-1][1]) + len(text) <= EVENT_MAX_CHARS:
            self._lines[-1] = (stream, self._lines[-1][1] + text)
        else:
            self._lines.append((stream, text))

    @property
    def pending(self) -> bool:
        return bool(self._lines)

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        """The events made of the complete lines seen so far."""
        lines, self._lines = self._lines, []
        return [(self.kind, {**self.data, "stream": s, "text": t}) for s, t in lines]

    def finish(self) -> list[tuple[str, dict[str, Any]]]:
        """The rest, once the tool has ended: unfinished lines, and the note."""
        for stream, decoder in self._decoders.items():
            rest = self._partial.pop(stream, "") + decoder.decode(b"", final=True)
            if rest:
                self._add(stream, rest)
        events = self.take()
        if self.dropped:
            events.append((self.kind, {**self.data, "stream": "note", "truncated": True,
                                       "text": f"[output over {self.max_bytes} bytes: "
                                               f"{self.dropped} more bytes not shown]\n"}))
        return events
