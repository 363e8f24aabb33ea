"""Delivering completion webhooks (the reaper's leader runs it).

Each pass takes the deliveries that are due and whose run has finished,
checks the URL again (its host on the admin's allowlist, and every address
it resolves to public unless the host is allowed private addresses: no
loopback, link-local, private, multicast or reserved address, so a run
cannot aim the leader at the cluster's own services or a metadata
endpoint), POSTs the signed body to the address it checked (the host name
kept for the Host header and TLS, so DNS cannot answer differently between
the check and the connection) (core/webhooks.py) without following
redirects, and records the attempt. A failure is retried after
min(300, 2^tries) s, up to MAX_TRIES.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from runlease.core.webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, allowed, host_of, signature
from runlease.db.store import RunStore
from runlease.db.webhooks import MAX_TRIES, Due
from runlease.errors import RunleaseError, ValidationError

log = logging.getLogger(__name__)
TIMEOUT_S = 10.0


class Refused(Exception):
    """The URL may not be called (not allowed, or resolves where it may not)."""


@dataclass(frozen=True)
class Pinned:
    """What a request to a pinned address carries of the URL's host name."""

    headers: dict[str, str] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)


async def _addresses(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    return not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
                or ip.is_reserved or ip.is_unspecified)


class WebhookSender:
    def __init__(self, store: RunStore, *, batch: int = 100,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.store = store
        self.batch = batch
        self._transport = transport

    async def run_once(self) -> int:
        """Deliver what is due; returns how many attempts were made."""
        due = await self.store.take_due_webhooks(batch=self.batch)
        if not due:
            return 0
        hosts = await self.store.webhook_hosts()
        async with httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False,
                                     transport=self._transport) as http:
            await asyncio.gather(*(self._deliver(http, d, hosts) for d in due))
        return len(due)

    async def _deliver(self, http: httpx.AsyncClient, due: Due,
                       hosts: list[tuple[str, bool]]) -> None:
        body = json.dumps({
            "delivery_id": f"{due.run_id}:{due.tries}", "run_id": str(due.run_id),
            "tenant_id": due.tenant_id, "pool": due.pool, "status": due.status,
            "error_code": due.error_code,
            "finished_at": due.finished_at.isoformat() if due.finished_at else None,
        }, separators=(",", ":")).encode()
        attempt: dict[str, Any] = {"try": due.tries, "at": time.time()}
        try:
            url, pinned = await self._check(due.url, hosts)
            if due.secret is None:
                raise Refused("the tenant has no signing key")
            stamp = int(time.time())
            response = await http.post(url, content=body, headers={
                "Content-Type": "application/json", TIMESTAMP_HEADER: str(stamp),
                SIGNATURE_HEADER: signature(due.secret, stamp, body),
                "User-Agent": "runlease-webhooks", **pinned.headers},
                extensions=pinned.extensions)
            attempt["status_code"] = response.status_code
            ok = 200 <= response.status_code < 300
            if not ok:
                attempt["error"] = f"HTTP {response.status_code}"
        except (Refused, ValidationError) as exc:
            attempt["error"], ok = f"refused: {exc}"[:300], False
            await self._record(due, "failed", attempt)
            return
        except (httpx.HTTPError, OSError) as exc:
            attempt["error"], ok = f"{type(exc).__name__}: {exc}"[:300], False
        if ok:
            await self._record(due, "delivered", attempt)
        elif due.tries >= MAX_TRIES:
            await self._record(due, "failed", attempt)
        else:
            await self._record(due, "waiting", attempt, retry_s=min(300.0, 2.0 ** due.tries))

    async def _check(self, url: str, hosts: list[tuple[str, bool]]) -> tuple[str, Pinned]:
        """The URL to connect to: for a host that must resolve to public
        addresses, the address that was checked, with the host name kept for
        the Host header and TLS (SNI and the certificate), so a second lookup
        (DNS rebinding) cannot send the request somewhere else."""
        host = host_of(url)
        ok, private = allowed(host, hosts)
        if not ok:
            raise Refused(f"host {host!r} is not on the webhook allowlist")
        if private:
            return url, Pinned()
        parsed = httpx.URL(url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        addresses = await _addresses(host.strip("[]"), port)
        bad = [a for a in addresses if not _public(a)]
        if bad or not addresses:
            raise Refused(f"host {host!r} resolves to a non-public address {bad[:3]}")
        address = addresses[0]
        literal = f"[{address}]" if ":" in address else address
        return str(parsed.copy_with(host=literal)), Pinned(
            {"Host": parsed.netloc.decode("ascii")},
            {"sni_hostname": host} if parsed.scheme == "https" else {})

    async def _record(self, due: Due, state: str, attempt: dict[str, Any],
                      retry_s: float = 0.0) -> None:
        try:
            await self.store.record_webhook(due, state=state, retry_s=retry_s, attempt=attempt)
        except RunleaseError as exc:  # retried anyway: the take put it out of reach only
            log.warning("webhook_record_failed run_id=%s error=%s", due.run_id, exc)
        log.info("webhook_attempt run_id=%s try=%s state=%s status=%s", due.run_id, due.tries,
                 state, attempt.get("status_code"))
