"""Completion webhooks: the URL a run may name, and the signature its
delivery carries.

A delivery is `POST <url>` with a JSON body and two headers:

    Runlease-Timestamp: <unix seconds>
    Runlease-Signature: v1=<hex HMAC-SHA256(tenant secret, "<timestamp>.<body>")>

The receiver recomputes the HMAC over the raw body and refuses a timestamp
older than a few minutes (a replayed delivery); the body's `delivery_id`
is the same on every try of one delivery (`try` counts them), so a
receiver drops a repeat it already handled.

A URL's port must be 80 or 443, or one the admin listed for its host: an
allowed host is not a port scanner (`port_allowed`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from runlease.errors import ValidationError

URL_MAX_CHARS = 2048
TIMESTAMP_HEADER = "Runlease-Timestamp"
SIGNATURE_HEADER = "Runlease-Signature"
DEFAULT_TOLERANCE_S = 300
HOST_PATTERN = r"^(\*\.)?[a-z0-9]([a-z0-9.:\[\]-]{0,251}[a-z0-9\]])?$"
_HOST_RE = re.compile(HOST_PATTERN)
@dataclass(frozen=True)
class WebhookLimits:
    """What deliveries may cost the process that sends them."""

    deadline_s: float = 15.0  # one delivery, whole: resolve, connect, send, read
    max_response_bytes: int = 64 * 1024  # of an answer, read and discarded
    in_flight: int = 64  # deliveries at once, all tenants
    per_tenant: int = 4  # deliveries at once of one tenant
    lease_s: int = 60  # a taken delivery is out of reach this long (> deadline_s: at most 50)


STANDARD_PORTS = (80, 443)
MAX_PORTS = 16


@dataclass(frozen=True, slots=True)
class HostRule:
    """One entry of the admin's allowlist."""

    pattern: str
    allow_private: bool = False
    ports: tuple[int, ...] = ()  # beside 80 and 443


def check_ports(ports: object) -> tuple[int, ...]:
    if not isinstance(ports, list | tuple) or len(ports) > MAX_PORTS or not all(
            isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports):
        raise ValidationError("ports", f"at most {MAX_PORTS} ports, each 1..65535")
    return tuple(sorted(set(ports)))


def port_of(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def port_allowed(port: int, rule: HostRule) -> bool:
    return port in STANDARD_PORTS or port in rule.ports


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


def allowed(host: str, rules: Iterable[HostRule]) -> HostRule | None:
    """The allowlist's entry for the host, if any."""
    for rule in rules:
        pattern = rule.pattern
        if pattern == host or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return rule
    return None


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
