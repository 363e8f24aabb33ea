"""Bearer tokens: each maps to one tenant or to admin; kept hashed.

Tokens come from settings (tenant=token pairs, admin tokens) or a file. Only
their SHA-256 is kept in memory, and a token may be configured as
`sha256:<hex>` so the secret never appears in configuration at all.

Browsers' EventSource cannot send an Authorization header, so a caller can
trade its token for a stream token: short-lived, signed, and valid only for
one run's event stream.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from runlease.core.bounds import check_tenant
from runlease.errors import SettingsError, ValidationError


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: str | None  # None for admin
    admin: bool = False

    @property
    def scope(self) -> str | None:
        """The tenant to restrict store calls to; None (all) for admin."""
        return None if self.admin else self.tenant_id


ADMIN = Principal(None, admin=True)


def _digest(token: str) -> str:
    if token.startswith("sha256:"):
        value = token[len("sha256:"):].lower()
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise SettingsError("a sha256: token must be 64 hex digits")
        return value
    if len(token) < 16:
        raise SettingsError("tokens must be at least 16 characters")
    return hashlib.sha256(token.encode()).hexdigest()


def parse_token_pairs(items: Iterable[str]) -> list[tuple[str, str]]:
    """`tenant=token` items as (tenant, token), whitespace stripped, in order
    (a tenant may appear twice: both of its tokens are valid)."""
    pairs = []
    for item in items:
        tenant, sep, token = (part.strip() for part in item.partition("="))
        if not sep or not tenant or not token:
            raise ValueError(f"{item!r}: expected TENANT=TOKEN")
        pairs.append((tenant, token))
    return pairs


class TokenRegistry:
    def __init__(self) -> None:
        self._by_digest: dict[str, Principal] = {}

    def add(self, token: str, principal: Principal) -> None:
        digest = _digest(token)
        existing = self._by_digest.get(digest)
        if existing is not None and existing != principal:
            raise SettingsError("one token is configured for two principals")
        self._by_digest[digest] = principal

    def add_tenant(self, tenant: str, token: str) -> None:
        try:
            check_tenant(tenant)
        except ValidationError as exc:
            raise SettingsError(f"token for tenant {tenant!r}: {exc.message}") from None
        self.add(token, Principal(tenant))

    def load_pairs(self, pairs: str) -> None:
        items = filter(None, (p.strip() for p in pairs.split(",")))
        try:
            parsed = parse_token_pairs(items)
        except ValueError:  # its message holds the token: not for logs
            raise SettingsError("tokens must be tenant=token pairs, comma-separated") from None
        for tenant, token in parsed:
            self.add_tenant(tenant, token)

    def load_file(self, path: str) -> None:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise SettingsError(f"cannot read tokens file {path}: {exc}") from None
        for n, line in enumerate(lines, start=1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise SettingsError(f"{path}:{n}: expected `<tenant or admin> <token>`")
            who, token = parts
            if who == "admin":
                self.add(token, ADMIN)
            else:
                self.add_tenant(who, token)

    def __len__(self) -> int:
        return len(self._by_digest)

    def by_digest(self) -> dict[str, Principal]:
        """Each configured token's SHA-256 and its principal (a copy): the
        console ties a session to the token it came from."""
        return dict(self._by_digest)

    @staticmethod
    def digest_of(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def authenticate(self, token: str) -> Principal | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        # A dict lookup by digest reveals nothing useful through timing: the
        # digest of a guess says nothing about the digest of a real token.
        return self._by_digest.get(digest)


class StreamTokens:
    """HMAC-signed tokens: `<run id>.<tenant or *>.<expiry>.<signature>`."""

    def __init__(self, secret: str | None, ttl_s: int) -> None:
        self._key = (secret or secrets.token_urlsafe(32)).encode()
        self.ttl_s = ttl_s

    def _sign(self, payload: str) -> str:
        mac = hmac.new(self._key, payload.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def issue(
        self, run_id: UUID, principal: Principal, now: float | None = None
    ) -> tuple[str, int]:
        expires = int((now or time.time()) + self.ttl_s)
        who = "*" if principal.admin else (principal.tenant_id or "")
        body = base64.urlsafe_b64encode(f"{run_id}\n{who}\n{expires}".encode()).decode()
        body = body.rstrip("=")
        return f"{body}.{self._sign(body)}", expires

    def verify(self, token: str, run_id: UUID, now: float | None = None) -> Principal | None:
        if not token.isascii():  # compare_digest takes ASCII strings only
            return None
        body, _, signature = token.partition(".")
        if not body or not hmac.compare_digest(signature, self._sign(body)):
            return None
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
            run, who, expires = raw.split("\n")
        except ValueError:
            return None
        if run != str(run_id) or int(expires) < (now or time.time()):
            return None
        return ADMIN if who == "*" else Principal(who)
