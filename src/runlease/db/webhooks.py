"""Completion webhooks in the database (statements in sql/webhooks.sql):
the admin's host allowlist, each tenant's signing key, one delivery per run."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from runlease.core import bounds
from runlease.core.webhooks import allowed, check_host_pattern, host_of
from runlease.db.executor import Conn, Executor
from runlease.errors import NotAllowed, ValidationError

MAX_HOSTS = 1000
MAX_TRIES = 10


@dataclass(frozen=True, slots=True)
class Due:
    """A delivery taken by the leader: what to POST, and where."""

    run_id: UUID
    tenant_id: str
    url: str
    tries: int
    status: str
    pool: str
    error_code: str | None
    finished_at: datetime | None
    secret: str | None


class WebhookStore(Executor):
    async def webhook_hosts(self, *, conn: Conn | None = None) -> list[tuple[str, bool]]:
        rows = await self._rows("webhook_hosts_list", {}, conn)
        return [(r["pattern"], r["allow_private"]) for r in rows]

    async def set_webhook_hosts(self, hosts: Sequence[tuple[str, bool]], *,
                                conn: Conn | None = None) -> None:
        if len(hosts) > MAX_HOSTS:
            raise ValidationError("hosts", f"at most {MAX_HOSTS}")
        # A host named twice is one entry, the last saying whether it may be private.
        chosen = {check_host_pattern(h): bool(p) for h, p in hosts}
        await self._rows("webhook_hosts_replace", {
            "patterns": list(chosen), "private": list(chosen.values())}, conn)

    async def check_webhook_url(self, url: object, *, conn: Conn | None = None) -> str:
        """The URL, if its host is on the admin's allowlist (NotAllowed otherwise;
        ValidationError for a malformed URL)."""
        host = host_of(url)
        if not allowed(host, await self.webhook_hosts(conn=conn))[0]:
            raise NotAllowed("webhook_url", f"host {host!r} is not on the webhook allowlist")
        assert isinstance(url, str)
        return url

    async def webhook_secret(self, tenant_id: str, *, rotate: bool = False,
                             conn: Conn | None = None) -> str:
        """The tenant's signing key (made on first use; a new one on rotate)."""
        bounds.check_tenant(tenant_id)
        rows = await self._rows("webhook_secret_rotate" if rotate else "webhook_secret_ensure",
                                {"tenant": tenant_id, "secret": "whsec_" + secrets.token_hex(24)},
                                conn)
        return str(rows[0]["secret"])

    async def add_webhook(self, run_id: UUID, tenant_id: str, url: str, *,
                          conn: Conn | None = None) -> None:
        await self.webhook_secret(tenant_id, conn=conn)
        await self._rows("webhook_add", {"id": run_id, "tenant": tenant_id, "url": url}, conn)

    async def webhook(self, run_id: UUID, *, tenant_id: str | None = None,
                      conn: Conn | None = None) -> dict[str, Any] | None:
        rows = await self._rows("webhook_get", {"id": run_id, "tenant": tenant_id}, conn)
        return dict(rows[0]) if rows else None

    async def take_due_webhooks(self, *, batch: int = 100, lease_s: int = 60,
                                conn: Conn | None = None) -> list[Due]:
        rows = await self._rows("webhook_take_due", {"batch": batch, "lease_s": lease_s}, conn)
        return [Due(**dict(r)) for r in rows]

    async def record_webhook(self, due: Due, *, state: str, retry_s: float,
                             attempt: dict[str, Any], conn: Conn | None = None) -> None:
        await self._rows("webhook_record", {
            "id": due.run_id, "tries": due.tries, "state": state, "retry_s": retry_s,
            "attempt": json.dumps(attempt)}, conn)
