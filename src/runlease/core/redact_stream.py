"""Redaction of streamed text: how much of what a stream has sent so far can be
stored without cutting a secret in two (`StreamHoldback`, see RunContext.delta).

The rules are redact.py's; this module only decides where text may be cut:
each stored piece ends where no secret can straddle it, and where redacting
both sides apart gives what redacting them together gives.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from runlease.core.redact import (
    _HEADER_KEY,
    _HEADER_VALUE,
    _KEY,
    _LINE_KEYS,
    _QUOTED,
    _SEP,
    MASK,
    Redactor,
    is_secret_key,
)

# Regions that a secret may still be running through at the end of a text
# (see open_from). All but private key blocks end at the end of a line.
_PEM_OPEN_RE = re.compile(
    r"-----BEGIN (?:[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----"
    r"(?:(?!-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----).)*|[A-Z0-9 ]*)\Z",
    re.DOTALL,
)
_LINE_HEADER_OPEN_RE = re.compile(
    rf"(?i)[ \t]*(?:[<>][ \t]*)?(?:[\w.-]{{0,64}}?[_-])?(?:{_LINE_KEYS})[ \t]*:")
_HEADER_KEY_RE = re.compile(rf"(?i){_HEADER_KEY}")
_HEADER_VALUE_RE = re.compile(_HEADER_VALUE)
_SCHEME_ONLY_RE = re.compile(r"[A-Za-z][\w-]*[ \t]+\Z")
_MORE_RE = re.compile(r"[,;][ \t]*\Z")
_QUOTE_OPEN_RE = re.compile(rf"({_KEY})(?:{_SEP})(\\?[\"'])")
_QUOTED_RE = re.compile(_QUOTED)
_HEADER_CLOSED_RE = re.compile(rf"[ \t]*(?:{_QUOTED})[ \t]*[,;}}\]\r\n]")
_LAST_WORD_RE = re.compile(rf"({_KEY})(?:{_SEP})?[ \t]*\Z")
_INTRODUCERS = ("bearer", "basic", "token", "-u", "--user")


def open_from(text: str) -> int | None:
    """Where a region that may hold a secret starts and has not ended by the
    end of `text` (None: no such region). Text must not be cut inside one:
    a private key block with no END yet; on the last line, a credential
    header that starts the line (`Cookie: ...`), one inside the line whose
    value may go on (`Cookie: a=1; `), a quoted value after a secret key with
    no closing quote, or a last word after which a secret follows
    (`Bearer `, `password = `, `--password `, `-u `)."""
    starts: list[int] = []
    pem = text.rfind("-----BEGIN ")
    if pem >= 0 and _PEM_OPEN_RE.match(text, pem):
        starts.append(pem)
    line = max(text.rfind("\n"), text.rfind("\r")) + 1
    if _LINE_HEADER_OPEN_RE.match(text, line):
        starts.append(line)
    for header in _HEADER_KEY_RE.finditer(text, line):
        if _header_open(text, header.end()):
            starts.append(header.start())
            break
    for m in _QUOTE_OPEN_RE.finditer(text, line):
        if is_secret_key(m.group(1)) and not _QUOTED_RE.match(text, m.start(2)):
            starts.append(m.start())
            break
    last = _LAST_WORD_RE.search(text, line)
    if last is not None and (is_secret_key(last.group(1))
                             or last.group(1).lower() in _INTRODUCERS):
        starts.append(last.start())
    return min(starts) if starts else None


def _header_open(text: str, at: int) -> bool:
    """Whether a header value inside a line, starting at `at`, may go on:
    not begun, only its scheme word so far, ending in `,`/`;` or an open
    quote, or running to the end of text."""
    if _HEADER_CLOSED_RE.match(text, at):
        return False  # a quoted value followed by what ends it (`,`, `}`...)
    if at == len(text) or _SCHEME_ONLY_RE.match(text, at):
        return True
    value = _HEADER_VALUE_RE.match(text, at)
    if value is None:
        return True  # an open quote (`Cookie: "a b`)
    return value.end() == len(text) or bool(_MORE_RE.match(text, value.end()))


_LINE_KEY_NAMES = ("authorization", "cookie", "cookies")
_LAST_WORD_ONLY_RE = re.compile(
    r"[ \t]*(?:[<>][ \t]*)?(?=[\w.-])(?:[\w.-]*[_-])?([a-zA-Z]*)[ \t]*\Z")


def _may_be_header(text: str, at: int) -> bool:
    """Whether a credential header's name starts at `at`, or may yet: the
    text from there is one word so far that could grow into one (`Cook`,
    `Set-Coo`, `X-Goog-Authoriz`)."""
    if _LINE_HEADER_OPEN_RE.match(text, at):
        return True
    word = _LAST_WORD_ONLY_RE.match(text, at)
    return word is not None and any(k.startswith(word.group(1).lower())
                                    for k in _LINE_KEY_NAMES)


class StreamHoldback:
    """Text that arrives in pieces (a model's deltas), handed out in pieces
    that never cut a secret in two.

    `feed` takes the next piece and returns the prefix of everything held
    that is safe to store now; the rest (the last word, and any region that
    a secret may still be running through, see open_from) is held. A cut
    falls only after whitespace, outside open regions, and where redacting
    the two sides apart gives what redacting them together gives, so even a
    configured pattern that spans whitespace is not cut once its match is
    complete. `end` returns what is still held, at the end of the message.

    The hold is bounded: past `max_chars` with no safe cut, what is held is
    replaced by one MASK and what follows is dropped until the region ends
    (its next safe cut): a secret is never stored in pieces; a very long
    word, or text after an unterminated key block, is lost instead.
    What is returned still has to pass Redactor.text (the store does that).
    """

    def __init__(self, redactor: Redactor, max_chars: int = 16 * 1024) -> None:
        self.redactor = redactor
        self.max_chars = max_chars
        self.held = ""
        # While dropping: the start of the masked region, so that open_from
        # still sees it open (a key block's BEGIN line, `Cookie:`).
        self._dropped: str | None = None

    def feed(self, text: str) -> str:
        self.held += text
        if self._dropped is not None and not self._end_drop():
            return ""
        cut = self._cut(self.held)
        if cut:
            out, self.held = self.held[:cut], self.held[cut:]
            return out
        if len(self.held) > self.max_chars:
            start = open_from(self.held) or 0
            self._dropped, self.held = self.held[start:start + 512], ""
            return MASK
        return ""

    @property
    def holding(self) -> bool:
        """Text is held, or a masked region is being dropped."""
        return bool(self.held) or self._dropped is not None

    def end(self) -> str:
        if self._dropped is not None:
            self._end_drop(final=True)
        held, self.held, self._dropped = self.held, "", None
        return held

    def _end_drop(self, *, final: bool = False) -> bool:
        """Drop held text up to the end of the masked region; True once it ended."""
        assert self._dropped is not None
        context = self._dropped
        for i in _cuts(self.held):
            if open_from(context + self.held[:i]) is None:
                # Keep the whitespace that ended the region.
                self.held, self._dropped = self.held[i - 1:], None
                return True
        # Still inside: keep only a tail, enough to see where the region ends.
        self.held = "" if final else self.held[-1024:]
        return False

    def _cut(self, text: str) -> int:
        """The last safe cut in text (0: none)."""
        limit = open_from(text)
        end = len(text) if limit is None else limit
        whole: str | None = None
        tries = 0
        i = end
        while tries < 8:
            i = _last_cut(text, i)
            if i <= 0:
                return 0
            tries += 1
            head = text[:i]
            # Not just before a header inside a line (or a word that may yet
            # become one, or a word not seen yet): its piece would start with
            # it, and a header that starts a piece loses the whole line.
            if text[i - 1] not in "\r\n" and (i == len(text) or _may_be_header(text, i)):
                pass
            elif open_from(head) is None:
                whole = self.redactor.text(text) if whole is None else whole
                if self.redactor.text(head) + self.redactor.text(text[i:]) == whole:
                    return i
            i -= 1
        return 0


def _last_cut(text: str, before: int) -> int:
    """The largest i <= before just after whitespace (0: none)."""
    for i in range(before, 0, -1):
        if text[i - 1].isspace():
            return i
    return 0


def _cuts(text: str) -> Iterable[int]:
    """Every i just after whitespace, in order."""
    return (i + 1 for i, ch in enumerate(text) if ch.isspace())
