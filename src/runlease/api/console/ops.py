"""Console pages for operations (admin): dead letters (redrive many),
pools (depth, in flight per tenant against its limit, pause, limits) and
workers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from runlease.api.console.deps import AdminForm, AdminWho, BadRequest, Store, console_state
from runlease.core import bounds
from runlease.core.states import RunStatus
from runlease.db.keys import KeyLimits
from runlease.db.models import Pool
from runlease.db.store import RunStore
from runlease.db.workers import PoolHealth, WorkerRow
from runlease.errors import InvalidTransition, RunNotFound, UnknownPool, ValidationError

router = APIRouter(prefix="/ui", include_in_schema=False)

PAGE_SIZE = 50
MAX_REDRIVE = 100
MAX_POOLS = 50
MAX_TENANTS_SHOWN = 100
HEALTH_WINDOW_S = 3600
MAX_WORKERS = 500


def see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def _checked(check: Callable[[str], object], value: str) -> str:
    try:
        return str(check(value)) if value else ""
    except ValidationError as exc:
        raise BadRequest(f"{exc.field}: {exc.message}") from None


def _cursor(value: str) -> UUID | None:
    try:
        return UUID(value) if value else None
    except ValueError:
        raise BadRequest("cursor: not a run id") from None


@router.get("/dead")
async def dead_page(request: Request, who: AdminWho, store: Store) -> Response:
    args = request.query_params
    pool = _checked(bounds.check_pool, args.get("pool", "").strip())
    tenant = _checked(bounds.check_tenant, args.get("tenant", "").strip())
    cursor = _cursor(args.get("cursor", "").strip())
    runs = await store.list_runs(tenant_id=tenant or None, pool=pool or None,
                                 status=RunStatus.DEAD, limit=PAGE_SIZE, before=cursor)
    base = {"pool": pool, "tenant": tenant}
    next_query = (urlencode({k: v for k, v in base.items() if v} | {"cursor": str(runs[-1].id)})
                  if len(runs) == PAGE_SIZE else None)
    done = {k: int(v) for k in ("redriven", "skipped")
            if (v := args.get(k, "")).isdigit() and len(v) < 7}
    return console_state(request).renderer.page(request, "dead.html", {
        "viewer": who, "runs": runs, "pool": pool, "tenant": tenant, "paged": cursor is not None,
        "next_query": next_query, "done": done, "max_redrive": MAX_REDRIVE})


@router.post("/dead/redrive")
async def dead_redrive(form: AdminForm, store: Store) -> Response:
    raw = form.fields.get("id", [])
    if not raw:
        raise BadRequest("select at least one dead run to redrive")
    if len(raw) > MAX_REDRIVE:
        raise BadRequest(f"redrive at most {MAX_REDRIVE} runs at once")
    try:
        ids = list(dict.fromkeys(UUID(v) for v in raw))
    except ValueError:
        raise BadRequest("id: not a run id") from None
    redriven = skipped = 0
    for run_id in ids:
        try:
            await store.redrive(run_id)
            redriven += 1
        except (InvalidTransition, RunNotFound):  # redriven meanwhile, or deleted
            skipped += 1
    return see_other(f"/ui/dead?redriven={redriven}&skipped={skipped}")


async def pool_view(store: RunStore, pool: Pool) -> dict[str, Any]:
    """One pool's depth, in flight per tenant against its limit, and its
    lease expiries and stale writes over the last hour."""
    stats = await store.queue_stats(pool.name)
    settings = await store.tenant_settings(pool.name)
    tenants = sorted(set(stats.by_tenant) | set(settings),
                     key=lambda t: (-sum(stats.by_tenant.get(t, (0, 0, 0))[::2]), t))
    rows = []
    for tenant in tenants[:MAX_TENANTS_SHOWN]:
        pending, ready, leased = stats.by_tenant.get(tenant, (0, 0, 0))
        own = settings[tenant].max_in_flight if tenant in settings else None
        rows.append({"tenant": tenant, "pending": pending, "ready": ready,
                     "scheduled": pending - ready, "leased": leased, "own_limit": own,
                     "limit": own if own is not None else pool.default_max_in_flight})
    health = (await store.pool_health(HEALTH_WINDOW_S, pool.name)).get(pool.name, PoolHealth())
    service = (await store.pool_service(pool.name)).get(pool.name)
    return {"pool": pool, "stats": stats, "tenants": rows,
            "more_tenants": max(0, len(tenants) - MAX_TENANTS_SHOWN), "health": health,
            "key_limits": await store.key_limits(pool.name), "service": service}


@router.get("/pools")
async def pools_page(request: Request, who: AdminWho, store: Store) -> Response:
    views = [await pool_view(store, pool) for pool in (await store.list_pools())[:MAX_POOLS]]
    return console_state(request).renderer.page(request, "pools.html", {
        "viewer": who, "pools": views, "notice": request.query_params.get("notice") == "saved"})


@router.get("/pools/{name}/stats")
async def pool_stats(request: Request, name: str, who: AdminWho, store: Store) -> Response:
    """A pool's numbers alone, polled by the pools page (its forms stay put)."""
    return console_state(request).renderer.page(
        request, "_pool_stats.html", {"viewer": who, "v": await pool_view(store, await
                                                                           _pool(store, name))})


async def _pool(store: RunStore, name: str) -> Pool:
    _checked(bounds.check_pool, name)
    pool = await store.get_pool(name)
    if pool is None:
        raise BadRequest(f"no pool {name!r}")
    return pool


@router.post("/pools/{name}/paused")
async def pool_paused(name: str, form: AdminForm, store: Store) -> Response:
    value = form.get("paused")
    if value not in ("true", "false"):
        raise BadRequest("paused: must be true or false")
    pool = await _pool(store, name)
    await store.upsert_pool(dataclasses.replace(pool, paused=value == "true"))
    return see_other("/ui/pools?notice=saved")


@router.post("/pools/{name}/limit")
async def pool_limit(name: str, form: AdminForm, store: Store) -> Response:
    tenant = _checked(bounds.check_tenant, form.get("tenant").strip())
    raw = form.get("max_in_flight").strip()
    if not tenant:
        raise BadRequest("tenant: required")
    if raw and not raw.isdigit():
        raise BadRequest("max_in_flight: a whole number, or empty to remove the limit")
    await _pool(store, name)
    try:
        await store.set_tenant_limit(name, tenant, int(raw) if raw else None)
    except (ValidationError, UnknownPool) as exc:
        raise BadRequest(str(exc)) from None
    return see_other("/ui/pools?notice=saved")


@router.post("/pools/{name}/key-limit")
async def pool_key_limit(name: str, form: AdminForm, store: Store) -> Response:
    """One key's (or pattern's) limit, or the pool's default per-key limit
    (no key); empty removes it. The other limits are kept."""
    key = form.get("key").strip()
    raw = form.get("max_in_flight").strip()
    if raw and not raw.isdigit():
        raise BadRequest("max_in_flight: a whole number, or empty to remove the limit")
    await _pool(store, name)
    current = await store.key_limits(name)
    keys = dict(current.keys)
    default = current.default
    if not key:
        default = int(raw) if raw else None
    elif raw:
        keys[key] = int(raw)
    else:
        keys.pop(key, None)
    try:
        await store.replace_key_limits(name, KeyLimits(default, keys))
    except ValidationError as exc:
        raise BadRequest(f"{exc.field}: {exc.message}") from None
    return see_other("/ui/pools?notice=saved")


@router.get("/workers")
async def workers_page(request: Request, who: AdminWho, store: Store) -> Response:
    pool = _checked(bounds.check_pool, request.query_params.get("pool", "").strip())
    workers = await store.list_workers(pool or None, limit=MAX_WORKERS)
    pools: dict[str, list[WorkerRow]] = {}
    for w in workers:
        pools.setdefault(w.pool, []).append(w)
    return console_state(request).renderer.page(request, "workers.html", {
        "viewer": who, "pools": pools, "pool": pool, "more": len(workers) == MAX_WORKERS,
        "max_workers": MAX_WORKERS})
