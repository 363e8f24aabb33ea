"""Completion webhooks over HTTP: a run's deliveries, the admin's host
allowlist, a tenant's signing key (core/webhooks.py says how to check one)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field, StrictBool

from runlease.api.deps import Admin, JsonBody, Store, Who
from runlease.api.errors import ErrorAnswer
from runlease.api.schemas import INTEGRAL, ErrorBody, Strict
from runlease.core import bounds, webhooks
from runlease.errors import RunNotFound

router = APIRouter(prefix="/v1")


class WebhookOut(BaseModel):
    url: str
    state: str = Field(description="waiting (for the run to finish, or for a retry), "
                                   "delivered or failed.")
    tries: int
    next_at: datetime
    delivered_at: datetime | None = None
    attempts: list[dict[str, Any]] = Field(
        description="The last attempts: {try, at, status_code, error}; error is a class "
                    "only: refused, private_address, timeout, connect, protocol, network, "
                    "http_status.")


class WebhookHost(Strict):
    host: str = Field(min_length=1, max_length=253, pattern=webhooks.HOST_PATTERN,
                      description="A host name or address; `*.example.com` for subdomains.")
    allow_private: StrictBool = Field(False, description="May resolve to loopback, private "
                                                         "or link-local addresses.")
    ports: list[Annotated[int, Field(strict=True, ge=1, le=65535), INTEGRAL]] = Field(
        default_factory=list, max_length=webhooks.MAX_PORTS,
        description="Ports URLs on this host may use beside 80 and 443 (any other is "
                    "refused: an allowed host is not a port scanner).")


class WebhookHosts(Strict):
    hosts: list[WebhookHost] = Field(max_length=1000)


class WebhookSecret(BaseModel):
    tenant_id: str
    secret: str = Field(description="HMAC-SHA256 key of the Runlease-Signature header.")


@router.get("/runs/{run_id}/webhook", response_model=WebhookOut)
async def run_webhook(run_id: UUID, who: Who, store: Store) -> WebhookOut:
    """The run's webhook delivery and its attempts; 404 if it named none."""
    found = await store.webhook(run_id, tenant_id=who.scope)
    if found is None:
        raise RunNotFound(run_id)
    return WebhookOut(**{k: v for k, v in found.items() if k != "run_id"})


@router.get("/webhook-hosts", response_model=WebhookHosts)
async def webhook_hosts(who: Admin, store: Store) -> WebhookHosts:
    return WebhookHosts(hosts=[WebhookHost(host=r.pattern, allow_private=r.allow_private,
                                           ports=list(r.ports))
                               for r in await store.webhook_hosts()])


@router.put("/webhook-hosts", response_model=WebhookHosts, dependencies=[JsonBody],
            responses={415: {"model": ErrorBody,
                             "description": "No `Content-Type: application/json`."}})
async def put_webhook_hosts(body: WebhookHosts, who: Admin, store: Store) -> WebhookHosts:
    """The hosts runs' webhook URLs may name become exactly these (admin)."""
    await store.set_webhook_hosts([webhooks.HostRule(h.host, h.allow_private, tuple(h.ports))
                                   for h in body.hosts])
    return await webhook_hosts(who, store)


@router.get("/webhook-secret", response_model=WebhookSecret)
async def webhook_secret(
    who: Who, store: Store,
    tenant_id: Annotated[str | None, Query(min_length=1, max_length=bounds.TENANT_MAX_CHARS,
                                           description="Admin: whose key.")] = None,
) -> WebhookSecret:
    """The key that signs the caller's deliveries (made on first use)."""
    tenant = _tenant(who.tenant_id, who.admin, tenant_id)
    return WebhookSecret(tenant_id=tenant, secret=await store.webhook_secret(tenant))


@router.post("/webhook-secret/rotate", response_model=WebhookSecret)
async def rotate_webhook_secret(
    who: Who, store: Store,
    tenant_id: Annotated[str | None, Query(min_length=1,
                                           max_length=bounds.TENANT_MAX_CHARS)] = None,
) -> WebhookSecret:
    """A new signing key; deliveries from now on use it."""
    tenant = _tenant(who.tenant_id, who.admin, tenant_id)
    return WebhookSecret(tenant_id=tenant, secret=await store.webhook_secret(tenant,
                                                                             rotate=True))


def _tenant(own: str | None, admin: bool, given: str | None) -> str:
    if admin:
        if given is None:
            raise ErrorAnswer(403, "tenant_required", "tenant_id: an admin token has no key of "
                              "its own; name the tenant", "tenant_id")
        return given
    if given is not None and given != own:
        raise ErrorAnswer(403, "forbidden", "tenant_id: a tenant token sees its own key only",
                          "tenant_id")
    assert own is not None
    return own
