"""Pools and their per-tenant settings (statements in sql/pools.sql)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runlease.core import bounds
from runlease.db.executor import Conn, Executor
from runlease.db.models import Pool, TenantLimit
from runlease.errors import UnknownPool, ValidationError


class PoolStore(Executor):
    """Pool rows and per-tenant caps and priority bands."""

    async def upsert_pool(self, pool: Pool, *, conn: Conn | None = None) -> Pool:
        """Create or update a pool; every field of `pool` is written."""
        bounds.check_pool(pool.name)
        bounds.check_max_attempts(pool.max_attempts)
        bounds.check_lease_s(pool.lease_s)
        bounds.check_aging_s(pool.priority_aging_s)
        bounds.check_retention_s(pool.retention_s)
        tool_env = bounds.check_tool_env(pool.tool_env)
        if not isinstance(pool.paused, bool):
            raise ValidationError("paused", "must be true or false")
        if pool.default_max_in_flight is not None:
            bounds.check_max_in_flight("default_max_in_flight", pool.default_max_in_flight)
        rows = await self._rows(
            "pool_upsert",
            {
                "name": pool.name,
                "max_attempts": pool.max_attempts,
                "lease_s": pool.lease_s,
                "default_max_in_flight": pool.default_max_in_flight,
                "priority_aging_s": pool.priority_aging_s,
                "retention_s": pool.retention_s,
                "paused": pool.paused,
                "tool_env": list(tool_env),
            },
            conn,
        )
        return Pool.from_row(rows[0])

    async def get_pool(self, name: str, *, conn: Conn | None = None) -> Pool | None:
        rows = await self._rows("pool_get", {"name": name}, conn)
        return Pool.from_row(rows[0]) if rows else None

    async def list_pools(self, *, conn: Conn | None = None) -> list[Pool]:
        return [Pool.from_row(r) for r in await self._rows("pool_list", {}, conn)]

    async def replace_tenant_limits(
        self, pool: str, limits: Mapping[str, int | TenantLimit], *, conn: Conn | None = None
    ) -> None:
        """Make the pool's per-tenant settings exactly `limits` (an int is a
        cap alone)."""
        bounds.check_pool(pool)
        given: dict[str, TenantLimit] = {}
        for tenant, limit in limits.items():
            bounds.check_tenant(tenant)
            setting = limit if isinstance(limit, TenantLimit) else TenantLimit(limit)
            if setting.max_in_flight is not None:
                bounds.check_max_in_flight(f"limits[{tenant}]", setting.max_in_flight)
            try:
                bounds.check_priority_band(setting.priority_min, setting.priority_max)
                bounds.check_rates(setting.submits_per_minute, setting.tokens_per_minute)
            except ValidationError as exc:
                raise ValidationError(f"limits[{tenant}].{exc.field}", exc.message) from None
            given[tenant] = setting
        if await self.get_pool(pool, conn=conn) is None:
            raise UnknownPool(pool)
        await self._rows(
            "tenant_limits_replace",
            {"pool": pool, "tenants": list(given),
             "limits": [g.max_in_flight for g in given.values()],
             "mins": [g.priority_min for g in given.values()],
             "maxs": [g.priority_max for g in given.values()],
             "submits": [g.submits_per_minute for g in given.values()],
             "tokens": [g.tokens_per_minute for g in given.values()]},
            conn,
        )

    async def put_pool(
        self, pool: Pool, limits: Mapping[str, int | TenantLimit], *,
        conn: Conn | None = None
    ) -> Pool:
        """Create or update a pool and make its tenant settings exactly
        `limits`, in one transaction (the API's PUT and the operator)."""
        async with self.connection(conn) as c, c.transaction():
            stored = await self.upsert_pool(pool, conn=c)
            await self.replace_tenant_limits(pool.name, limits, conn=c)
        return stored

    async def claim_pool_owner(self, pool: str, owner: str, *,
                               conn: Conn | None = None) -> str:
        """Make `owner` the pool's owner unless it has another; the owner it
        has now (the operator compares it with its own key)."""
        bounds.check_pool(pool)
        rows = await self._rows("pool_owner_claim", {"name": pool, "owner": owner}, conn)
        return str(rows[0]["owner"])

    async def pool_owner(self, pool: str, *, conn: Conn | None = None) -> str | None:
        rows = await self._rows("pool_owner_get", {"name": pool}, conn)
        return rows[0]["owner"] if rows else None

    async def release_pool_owner(self, pool: str, owner: str, *,
                                 conn: Conn | None = None) -> None:
        """The pool has no owner any more, if `owner` was it."""
        await self._rows("pool_owner_release", {"name": pool, "owner": owner}, conn)

    async def set_queue_quotas(
        self, pool: str, default: int | None, tenants: Mapping[str, int], *,
        conn: Conn | None = None
    ) -> None:
        """The pool's quota of waiting runs per tenant (`default`, None: no
        quota) and the tenants' own, exactly those given (issue 32)."""
        bounds.check_pool(pool)
        for tenant, quota in [("(default)", default), *tenants.items()]:
            if tenant != "(default)":
                bounds.check_tenant(tenant)
            if quota is not None and not 0 <= quota <= bounds.MAX_PENDING_MAX:
                raise ValidationError("max_pending", f"0..{bounds.MAX_PENDING_MAX}")
        async with self.connection(conn) as c, c.transaction():
            if not await self._rows("pool_quota_set", {"pool": pool, "max_pending": default}, c):
                raise UnknownPool(pool)
            await self._rows("tenant_quotas_replace", {
                "pool": pool, "tenants": list(tenants), "quotas": list(tenants.values())}, c)
            await self._rows("tenant_limits_prune_all", {"pool": pool}, c)

    async def queue_quotas(self, pool: str, *,
                           conn: Conn | None = None) -> tuple[int | None, dict[str, int]]:
        """The pool's default quota of waiting runs, and the tenants' own."""
        rows = await self._rows("queue_quotas_get", {"pool": pool}, conn)
        if not rows:
            raise UnknownPool(pool)
        return rows[0]["default_max_pending"], dict(rows[0]["tenants"])

    async def set_tenant_limit(
        self, pool: str, tenant_id: str, max_in_flight: int | None, *, conn: Conn | None = None
    ) -> None:
        """Set one tenant's cap; None removes it (the pool's default applies
        again). Its priority band is kept."""
        bounds.check_pool(pool)
        bounds.check_tenant(tenant_id)
        if max_in_flight is not None:
            bounds.check_max_in_flight("max_in_flight", max_in_flight)
        await self._set_tenant("tenant_limit_set", pool, tenant_id,
                               {"max_in_flight": max_in_flight}, conn)

    async def set_tenant_priority_band(
        self, pool: str, tenant_id: str, priority_min: int | None, priority_max: int | None,
        *, conn: Conn | None = None,
    ) -> None:
        """Set the priorities a tenant may submit; None, None removes the band."""
        bounds.check_pool(pool)
        bounds.check_tenant(tenant_id)
        lo, hi = bounds.check_priority_band(priority_min, priority_max)
        await self._set_tenant("tenant_band_set", pool, tenant_id,
                               {"priority_min": lo, "priority_max": hi}, conn)

    async def set_tenant_rates(
        self, pool: str, tenant_id: str, submits_per_minute: int | None,
        tokens_per_minute: int | None, *, conn: Conn | None = None,
    ) -> None:
        """Set a tenant's rates (None: no such rate); its cap and band are kept."""
        bounds.check_pool(pool)
        bounds.check_tenant(tenant_id)
        bounds.check_rates(submits_per_minute, tokens_per_minute)
        await self._set_tenant("tenant_rate_set", pool, tenant_id,
                               {"submits_per_minute": submits_per_minute,
                                "tokens_per_minute": tokens_per_minute}, conn)

    async def _set_tenant(self, name: str, pool: str, tenant_id: str,
                          values: dict[str, Any], conn: Conn | None) -> None:
        async with self.connection(conn) as c, c.transaction():
            if await self.get_pool(pool, conn=c) is None:
                raise UnknownPool(pool)
            params = {"pool": pool, "tenant": tenant_id}
            await self._rows(name, params | values, c)
            await self._rows("tenant_limit_prune", params, c)

    async def tenant_limits(self, pool: str, *, conn: Conn | None = None) -> dict[str, int]:
        """Tenants' caps (only those that have one)."""
        return {t: s.max_in_flight for t, s in (await self.tenant_settings(pool, conn=conn)).items()
                if s.max_in_flight is not None}

    async def tenant_settings(
        self, pool: str, *, conn: Conn | None = None
    ) -> dict[str, TenantLimit]:
        rows = await self._rows("tenant_limits_list", {"pool": pool}, conn)
        return {r["tenant_id"]: TenantLimit.from_row(r) for r in rows}
