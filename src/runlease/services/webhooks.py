"""Delivering completion webhooks: a service of its own beside the reaper
(never inside the reaper's pass, so no receiver can delay a reap).

The elected leader's `WebhookDispatcher` takes the deliveries that are due
and whose run has finished, and starts each as its own task, at most
`in_flight` at once and at most `per_tenant` of one tenant's (the take
itself leaves out the tenants at their bound, so a tenant whose receiver
is slow waits for its own deliveries only). Each delivery:

- checks the URL again: its host on the admin's allowlist, its port 80,
  443 or one the admin listed for the host, and every address it resolves
  to public unless the host is allowed private addresses (`public()`: no
  loopback, link-local, private, shared (100.64/10), site-local, 6to4,
  NAT64, Teredo, multicast or reserved address, so a run cannot aim the
  leader at the cluster's own services or a metadata endpoint);
- POSTs the signed body to the address it checked (the host name kept for
  the Host header and TLS, so DNS cannot answer differently between the
  check and the connection) without following redirects;
- has one overall deadline (`deadline_s`: resolving, connecting, sending
  and reading together; a receiver that drips a byte at a time is cut off
  at it), and reads at most `max_response_bytes` of the answer, raw (no
  decompression: a gzip bomb is bytes like others), discarding them;
- records the attempt with its error reduced to a class (`timeout`,
  `connect`, `refused`, ...): a tenant reads its attempts back through
  `GET /v1/runs/{id}/webhook`, and details of the network it cannot see
  go to the operator's log only.

A failure is retried after min(300, 2^tries) s, up to MAX_TRIES; the body's
`delivery_id` is the same on every try.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from runlease.core.webhooks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    HostRule,
    WebhookLimits,
    allowed,
    host_of,
    port_allowed,
    signature,
)
from runlease.db.store import RunStore
from runlease.db.webhooks import MAX_TRIES, Due
from runlease.errors import RunleaseError, ValidationError
from runlease.services.leader import LeaderElector
from runlease.services.loop import PeriodicService

log = logging.getLogger(__name__)
DEFAULT_LIMITS = WebhookLimits()


class Refused(Exception):
    """The URL may not be called; `kind` is what the tenant is told."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


@dataclass(frozen=True)
class Pinned:
    """What a request to a pinned address carries of the URL's host name."""

    headers: dict[str, str] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)


async def _addresses(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


# Global by the registry's reckoning, but a way to somewhere that is not:
# site-local (deprecated, still routed inside some networks), 6to4, NAT64
# and Teredo embed an IPv4 address the network translates to; the IETF
# protocol assignments (192.0.0/24) and the documentation ranges are no
# receiver's.
_NOT_PUBLIC = tuple(ipaddress.ip_network(n) for n in (
    "fec0::/10", "2002::/16", "64:ff9b::/96", "64:ff9b:1::/48", "2001::/32", "2001:db8::/32",
    "192.0.0.0/24", "100::/64", "::/96",
))


def public(address: str) -> bool:
    """Whether a webhook may be sent to this address of a host that is not
    allowed private addresses: globally routable, and not one of the
    ranges that lead inside (100.64.0.0/10 is not global; an IPv4-mapped
    address is judged by its IPv4 address)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return public(str(ip.ipv4_mapped))
    if not ip.is_global or ip.is_multicast or ip.is_reserved or ip.is_unspecified:
        return False
    return not any(ip.version == net.version and ip in net for net in _NOT_PUBLIC)


def error_class(exc: BaseException) -> str:
    """What a tenant is told of a failed attempt: a class, never the text
    (which may name addresses and ports of a network it cannot see)."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError | ConnectionError | socket.gaierror):
        return "connect"
    if isinstance(exc, httpx.RemoteProtocolError | httpx.LocalProtocolError):
        return "protocol"
    return "network"


class WebhookSender:
    """Takes and delivers; the dispatcher runs it as a service, tests call
    `run_once()` (take a batch, deliver it, wait for all of it)."""

    def __init__(self, store: RunStore, *, batch: int = 100,
                 limits: WebhookLimits = DEFAULT_LIMITS,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.store = store
        self.batch = batch
        self.limits = limits
        self._transport = transport

    def client(self) -> httpx.AsyncClient:
        """No connection kept between deliveries: each is its own."""
        per_op = min(10.0, self.limits.deadline_s)
        return httpx.AsyncClient(
            timeout=httpx.Timeout(per_op), follow_redirects=False, transport=self._transport,
            limits=httpx.Limits(max_connections=self.limits.in_flight,
                                max_keepalive_connections=0))

    async def take(self, batch: int, busy: Counter[str] | None = None) -> list[Due]:
        return await self.store.take_due_webhooks(
            batch=batch, lease_s=self.limits.lease_s, per_tenant=self.limits.per_tenant,
            busy=busy)

    async def run_once(self) -> int:
        """Deliver what is due; returns how many attempts were made."""
        due = await self.take(self.batch)
        if not due:
            return 0
        hosts = await self.store.webhook_hosts()
        async with self.client() as http:
            await asyncio.gather(*(self.deliver(http, d, hosts) for d in due))
        return len(due)

    async def deliver(self, http: httpx.AsyncClient, due: Due, hosts: list[HostRule]) -> None:
        """One attempt, whole, within the deadline; recorded whatever happens."""
        body = json.dumps({
            "delivery_id": str(due.run_id), "try": due.tries, "run_id": str(due.run_id),
            "tenant_id": due.tenant_id, "pool": due.pool, "status": due.status,
            "error_code": due.error_code,
            "finished_at": due.finished_at.isoformat() if due.finished_at else None,
        }, separators=(",", ":")).encode()
        attempt: dict[str, Any] = {"try": due.tries, "at": time.time()}
        try:
            async with asyncio.timeout(self.limits.deadline_s):
                attempt["status_code"] = await self._post(http, due, body, hosts)
        except (Refused, ValidationError) as exc:
            attempt["error"] = exc.kind if isinstance(exc, Refused) else "refused"
            log.warning("webhook_refused run_id=%s tenant=%s error=%s", due.run_id,
                        due.tenant_id, exc)
            await self._record(due, "failed", attempt)
            return
        except (httpx.HTTPError, OSError, TimeoutError) as exc:
            attempt["error"] = error_class(exc)
            log.info("webhook_failed run_id=%s tenant=%s error=%s: %s", due.run_id,
                     due.tenant_id, type(exc).__name__, str(exc)[:300])
        code = attempt.get("status_code")
        if code is not None and 200 <= code < 300:
            await self._record(due, "delivered", attempt)
            return
        if code is not None:
            attempt["error"] = "http_status"
        if due.tries >= MAX_TRIES:
            await self._record(due, "failed", attempt)
        else:
            await self._record(due, "waiting", attempt, retry_s=min(300.0, 2.0 ** due.tries))

    async def _post(self, http: httpx.AsyncClient, due: Due, body: bytes,
                    hosts: list[HostRule]) -> int:
        """The answer's status; at most max_response_bytes of it read, raw."""
        url, pinned = await self._check(due.url, hosts)
        if due.secret is None:
            raise Refused("refused", "the tenant has no signing key")
        stamp = int(time.time())
        headers = {"Content-Type": "application/json", TIMESTAMP_HEADER: str(stamp),
                   SIGNATURE_HEADER: signature(due.secret, stamp, body),
                   "User-Agent": "runlease-webhooks", "Accept-Encoding": "identity",
                   **pinned.headers}
        async with http.stream("POST", url, content=body, headers=headers,
                               extensions=pinned.extensions) as response:
            left = self.limits.max_response_bytes
            if response.is_stream_consumed:  # an in-memory answer (a test's transport)
                return response.status_code
            async for chunk in response.aiter_raw():
                left -= len(chunk)
                if left <= 0:
                    break  # the rest is not read: closing the stream drops the connection
            return response.status_code

    async def _check(self, url: str, hosts: Iterable[HostRule]) -> tuple[str, Pinned]:
        """The URL to connect to: for a host that must resolve to public
        addresses, the address that was checked, with the host name kept for
        the Host header and TLS (SNI and the certificate), so a second lookup
        (DNS rebinding) cannot send the request somewhere else."""
        host = host_of(url)
        rule = allowed(host, hosts)
        if rule is None:
            raise Refused("refused", f"host {host!r} is not on the webhook allowlist")
        parsed = httpx.URL(url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        if not port_allowed(port, rule):
            raise Refused("refused", f"port {port} is not allowed for {host!r}")
        if rule.allow_private:
            return url, Pinned()
        addresses = await _addresses(host.strip("[]"), port)
        bad = [a for a in addresses if not public(a)]
        if bad or not addresses:
            raise Refused("private_address",
                          f"host {host!r} resolves to a non-public address {bad[:3]}")
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


class WebhookDispatcher(PeriodicService):
    """The leader's deliveries, each its own task, bounded (the module says
    how); every `interval_s` it takes what is due for the slots free."""

    name = "webhooks"

    def __init__(self, store: RunStore, elector: LeaderElector, *, interval_s: float = 1.0,
                 limits: WebhookLimits = DEFAULT_LIMITS,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(interval_s)
        self.elector = elector
        self.sender = WebhookSender(store, limits=limits, transport=transport)
        self.limits = limits
        self._http: httpx.AsyncClient | None = None
        self._in_flight: dict[asyncio.Task[None], str] = {}

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def in_flight_by_tenant(self) -> dict[str, int]:
        return dict(Counter(self._in_flight.values()))

    async def run_once(self) -> None:
        if self.elector.is_leader:
            await self.dispatch()

    async def dispatch(self) -> int:
        """Start the due deliveries that fit; how many were started."""
        free = self.limits.in_flight - len(self._in_flight)
        if free <= 0:
            return 0
        due = await self.sender.take(free, Counter(self._in_flight.values()))
        if not due:
            return 0
        hosts = await self.sender.store.webhook_hosts()
        if self._http is None:
            self._http = self.sender.client()
        for d in due:
            task = asyncio.create_task(self.sender.deliver(self._http, d, hosts),
                                       name=f"webhook-{d.run_id}")
            self._in_flight[task] = d.tenant_id
            task.add_done_callback(self._done)
        return len(due)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("webhook_task_failed", exc_info=task.exception())

    async def wait_idle(self) -> None:
        """Until the deliveries started so far have ended (for tests)."""
        while self._in_flight:
            await asyncio.wait(set(self._in_flight))

    async def on_stop(self) -> None:
        await self._drop()

    async def stop(self, timeout_s: float = 5.0) -> None:
        await super().stop(timeout_s)
        await self._drop()  # if the loop was cancelled before its on_stop

    async def _drop(self) -> None:
        """Deliveries under way are dropped: each is taken again after its
        lease_s, by whichever process leads then."""
        tasks = set(self._in_flight)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        if self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.aclose()
            self._http = None
