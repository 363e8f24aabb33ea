"""Console sessions: a signed, expiring cookie naming who signed in, and
the CSRF token every state-changing form carries.

The cookie holds `<who>\\n<expiry>\\n<nonce>\\n<token id>` (who: a tenant, or
`*` for admin; token id: an HMAC of the token's SHA-256, so a session ends
when its token is no longer configured) and an HMAC-SHA256 of it all under
the server's console secret: it never holds the token itself. The CSRF token
is an HMAC of the session's nonce, so it changes with every sign-in and
needs no server-side storage.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from runlease.api.auth import ADMIN, Principal

COOKIE = "runlease_session"
COOKIE_PATH = "/ui"
MAX_COOKIE_CHARS = 1024


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class Session:
    principal: Principal
    expires: int
    nonce: str
    token_id: str


class Sessions:
    """Issues and checks session cookies and CSRF tokens."""

    def __init__(self, secret: str | None, ttl_s: int) -> None:
        self._key = (secret or secrets.token_urlsafe(32)).encode()
        self.ttl_s = ttl_s

    def _mac(self, purpose: str, payload: str) -> str:
        return _b64(hmac.new(self._key, f"{purpose}\n{payload}".encode(),
                             hashlib.sha256).digest())

    def token_id(self, digest: str) -> str:
        """Names a configured token (by its SHA-256) without revealing it."""
        return self._mac("token", digest)[:22]

    def issue(self, who: Principal, token_id: str,
              now: float | None = None) -> tuple[str, Session]:
        expires = int((now if now is not None else time.time()) + self.ttl_s)
        session = Session(who, expires, secrets.token_urlsafe(16), token_id)
        name = "*" if who.admin else (who.tenant_id or "")
        body = _b64(f"{name}\n{expires}\n{session.nonce}\n{token_id}".encode())
        return f"{body}.{self._mac('session', body)}", session

    def read(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session a cookie carries; None when absent, forged or expired."""
        if not cookie or len(cookie) > MAX_COOKIE_CHARS:
            return None
        body, _, signature = cookie.partition(".")
        if not body or not hmac.compare_digest(signature, self._mac("session", body)):
            return None
        try:
            name, expires_text, nonce, token_id = _unb64(body).decode().split("\n")
            expires = int(expires_text)
        except ValueError:
            return None
        if expires <= (now if now is not None else time.time()) or not name or not nonce:
            return None
        return Session(ADMIN if name == "*" else Principal(name), expires, nonce, token_id)

    def csrf(self, session: Session) -> str:
        return self._mac("csrf", session.nonce)

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(token or "", self.csrf(session))
