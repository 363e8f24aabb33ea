"""Completion webhooks: the URL a run may name, and the signature its
delivery carries.

A delivery is `POST <url>` with a JSON body and two headers:

    Runlease-Timestamp: <unix seconds>
    Runlease-Signature: v1=<hex HMAC-SHA256(tenant secret, "<timestamp>.<body>")>

The receiver recomputes the HMAC over the raw body and refuses a timestamp
older than a few minutes (a replayed delivery); the body's `delivery_id`
(the run id and the try) lets it drop a repeat it already handled.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from runlease.errors import ValidationError

URL_MAX_CHARS = 2048
TIMESTAMP_HEADER = "Runlease-Timestamp"
SIGNATURE_HEADER = "Runlease-Signature"
DEFAULT_TOLERANCE_S = 300
HOST_PATTERN = r"^(\*\.)?[a-z0-9]([a-z0-9.:\[\]-]{0,251}[a-z0-9\]])?$"
_HOST_RE = re.compile(HOST_PATTERN)


def check_host_pattern(pattern: object) -> str:
    if not isinstance(pattern, str) or not _HOST_RE.fullmatch(pattern):
        raise ValidationError("host", "a host name, an address or *.domain, lower case")
    return pattern


def host_of(url: object) -> str:
    """The host of a webhook URL, after checking the URL: http or https, a
    host, no credentials, bounded. Raises ValidationError (field webhook_url)."""
    if not isinstance(url, str) or not 1 <= len(url) <= URL_MAX_CHARS:
        raise ValidationError("webhook_url", f"must be a URL of at most {URL_MAX_CHARS} chars")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a bad port
    except ValueError:
        raise ValidationError("webhook_url", "is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError("webhook_url", "must be an http or https URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValidationError("webhook_url", "must not carry credentials")
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        raise ValidationError("webhook_url", "must not contain whitespace or control chars")
    del port
    return parts.hostname.lower()


def allowed(host: str, patterns: Iterable[tuple[str, bool]]) -> tuple[bool, bool]:
    """(the host is on the allowlist, it may resolve to private addresses)."""
    for pattern, private in patterns:
        if pattern == host or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return True, private
    return False, False


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify(secret: str, headers: Mapping[str, str], body: bytes, now: float,
           tolerance_s: float = DEFAULT_TOLERANCE_S) -> bool:
    """For receivers: the delivery is ours, and fresh."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        timestamp = int(lowered[TIMESTAMP_HEADER.lower()])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(lowered.get(SIGNATURE_HEADER.lower(), ""),
                               signature(secret, timestamp, body))
