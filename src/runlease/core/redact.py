"""One redaction function for everything stored from a run.

Error messages and event data can carry what a tool printed: API keys, bearer
tokens, database URLs with passwords, private keys. They pass through here
before they reach the database, and error messages are truncated too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MASK = "[REDACTED]"

_DEFAULT_PATTERNS: tuple[tuple[str, str], ...] = (
    # PEM private keys, whole block.
    (
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
        MASK,
    ),
    # Authorization headers and bearer tokens.
    (r"(?i)\b(bearer|token|basic)\s+[A-Za-z0-9._~+/=-]{8,}", r"\1 " + MASK),
    # Passwords in URLs: scheme://user:password@host
    (r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*):[^@\s/]+@", r"\1:" + MASK + "@"),
    # Well-known key formats: OpenAI/Anthropic-style, GitHub, AWS, Slack, Google.
    (r"\bsk-[A-Za-z0-9_-]{16,}", MASK),
    (r"\bgh[pousr]_[A-Za-z0-9]{20,}", MASK),
    (r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", MASK),
    (r"\bxox[abprs]-[A-Za-z0-9-]{10,}", MASK),
    (r"\bAIza[0-9A-Za-z_-]{35}\b", MASK),
    # key=value / "key": "value" pairs whose key says secret (values that are
    # only digits, such as max_tokens=1000, are counts, not secrets).
    (
        r"(?i)([\"']?\b[\w-]*(?:api[_-]?key|secret|password|passwd|token|credential)[\w-]*[\"']?"
        r"\s*[:=]\s*[\"']?)(?!\d+\b)([^\s\"',;&}]{4,})",
        r"\1" + MASK,
    ),
)


_SECRET_KEY_RE = re.compile(
    r"(?i)(api[_-]?key|secret|password|passwd|credential|authorization|private[_-]?key"
    r"|(access|refresh|auth|api|bearer|session)[_-]?token)"
)


class Redactor:
    """Applies the default patterns plus any configured ones, in order."""

    def __init__(self, extra_patterns: Iterable[str] = ()) -> None:
        compiled = [(re.compile(p, re.DOTALL), r) for p, r in _DEFAULT_PATTERNS]
        compiled += [(re.compile(p), MASK) for p in extra_patterns]
        self._patterns = compiled

    def text(self, value: str) -> str:
        for pattern, replacement in self._patterns:
            value = pattern.sub(replacement, value)
        return value

    def message(self, value: str, max_chars: int) -> str:
        """Redact, then truncate (redacting first so truncation cannot split a secret)."""
        value = self.text(value)
        if len(value) > max_chars:
            value = value[: max_chars - 15] + "... [truncated]"
        return value

    def json(self, value: Any) -> Any:
        """Redact every string (keys included) in a JSON-like structure."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            # {"api_key": "..."}: the key says secret, so the whole value goes.
            return {
                self.text(str(k)): MASK
                if isinstance(v, str) and _SECRET_KEY_RE.search(str(k))
                else self.json(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.json(v) for v in value]
        return value


DEFAULT_REDACTOR = Redactor()
