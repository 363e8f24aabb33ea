"""Single-use signed resume links: approve/deny buttons in a chat tool or an
e-mail, for a person who has no token (issue 28).

A link names one request of one run: `<payload>.<mac>`, the payload
base64url JSON {"r": run id, "n": input name, "k": the request's nonce, "e":
expiry (unix s)}, the mac HMAC-SHA256 of the payload under the server's
resume key. Forging one needs the key; an expired one is refused; the nonce
is the request's own (a new request of the same name has another), and the
request takes one answer only, so a link works once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from uuid import UUID

MAX_TOKEN_CHARS = 512
MAX_LINK_S = 7 * 86_400  # a link without the request's own timeout lives a week


class LinkRefused(Exception):
    """A link that is forged, malformed or expired: the message says which,
    in words a person clicking a button can act on."""


@dataclass(frozen=True, slots=True)
class ResumeTarget:
    run_id: UUID
    name: str
    nonce: str
    expires: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ResumeLinks:
    def __init__(self, key: str | bytes) -> None:
        self._key = key.encode() if isinstance(key, str) else key

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, b"resume:" + payload.encode(), hashlib.sha256).digest())

    def issue(self, run_id: UUID, name: str, nonce: str, expires: int) -> str:
        payload = _b64(json.dumps({"r": str(run_id), "n": name, "k": nonce, "e": expires},
                                  separators=(",", ":")).encode())
        return f"{payload}.{self._mac(payload)}"

    def verify(self, token: str, now: float) -> ResumeTarget:
        if not token or len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
            raise LinkRefused("this link is not a resume link")
        payload, mac = token.split(".")
        if not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            raise LinkRefused("this link is not valid (it was changed, or made elsewhere)")
        try:
            data = json.loads(_unb64(payload))
            target = ResumeTarget(UUID(str(data["r"])), str(data["n"]), str(data["k"]),
                                  int(data["e"]))
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise LinkRefused("this link is not a resume link") from None
        if target.expires <= now:
            raise LinkRefused("this link has expired")
        return target
