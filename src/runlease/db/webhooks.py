"""Completion webhooks in the database (statements in sql/webhooks.sql):
the admin's host allowlist, each tenant's signing key, one delivery per run."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from runlease.core import bounds
from runlease.core.webhooks import (
    HostRule,
    allowed,
    check_host_pattern,
    check_ports,
    host_of,
    port_allowed,
    port_of,
)
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
    async def webhook_hosts(self, *, conn: Conn | None = None) -> list[HostRule]:
        rows = await self._rows("webhook_hosts_list", {}, conn)
        return [HostRule(r["pattern"], r["allow_private"], tuple(r["ports"])) for r in rows]

    async def set_webhook_hosts(self, hosts: Sequence[HostRule | tuple[str, bool]], *,
                                conn: Conn | None = None) -> None:
        """The allowlist becomes exactly these (a (pattern, allow_private)
        pair is an entry with no port beside 80 and 443)."""
        if len(hosts) > MAX_HOSTS:
            raise ValidationError("hosts", f"at most {MAX_HOSTS}")
        rules = [h if isinstance(h, HostRule) else HostRule(h[0], bool(h[1])) for h in hosts]
        # A host named twice is one entry, the last saying what it may do.
        chosen = {check_host_pattern(r.pattern): r for r in rules}
        await self._rows("webhook_hosts_replace", {
            "patterns": list(chosen), "private": [r.allow_private for r in chosen.values()],
            "ports": [",".join(map(str, check_ports(r.ports))) for r in chosen.values()]},
            conn)

    async def check_webhook_url(self, url: object, *, conn: Conn | None = None) -> str:
        """The URL, if its host is on the admin's allowlist and its port is 80,
        443 or one listed for the host (NotAllowed otherwise; ValidationError
        for a malformed URL)."""
        host = host_of(url)
        assert isinstance(url, str)
        rule = allowed(host, await self.webhook_hosts(conn=conn))
        if rule is None:
            raise NotAllowed("webhook_url", f"host {host!r} is not on the webhook allowlist")
        if not port_allowed(port_of(url), rule):
            raise NotAllowed("webhook_url", f"port {port_of(url)} is not allowed for {host!r}: "
                             "80, 443 or a port the admin lists for the host")
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
                                per_tenant: int = 1_000_000,
                                busy: Mapping[str, int] | None = None,
                                conn: Conn | None = None) -> list[Due]:
        """Up to `batch` due deliveries, each put out of reach for lease_s;
        at most per_tenant of a tenant's counting the `busy` it has in flight."""
        busy = dict(busy or {})
        rows = await self._rows("webhook_take_due", {
            "batch": batch, "lease_s": lease_s, "per_tenant": per_tenant,
            "scan": batch * 4, "full": [t for t, n in busy.items() if n >= per_tenant],
            "tenants": list(busy), "busy": list(busy.values())}, conn)
        return [Due(**dict(r)) for r in rows]

    async def record_webhook(self, due: Due, *, state: str, retry_s: float,
                             attempt: dict[str, Any], conn: Conn | None = None) -> None:
        await self._rows("webhook_record", {
            "id": due.run_id, "tries": due.tries, "state": state, "retry_s": retry_s,
            "attempt": json.dumps(attempt)}, conn)
