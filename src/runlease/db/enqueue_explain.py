"""Why the enqueue statement returned no row for a run (statements in
sql/runs.sql and sql/pools.sql): the store turns a missing row into the
run's own error."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from runlease.core import bounds
from runlease.db.executor import Conn, Executor
from runlease.errors import IdempotencyConflict, RunleaseError, UnknownPool, ValidationError

T = TypeVar("T")


class Explainer:
    """Why the insert returned no row for an item: the pool is unknown, the
    priority is outside the tenant's band, or the key names a run with
    another input. Pools and bands are read once per batch."""

    def __init__(self, store: Executor, conn: Conn | None) -> None:
        self.store, self.conn = store, conn
        self.pools: dict[str, bool] = {}
        self.bands: dict[tuple[str, str], tuple[int, int]] = {}

    async def why(self, pool: str, tenant: str, key: str | None,
                  priority: int) -> RunleaseError | None:
        rows = self.store._rows
        if pool not in self.pools:
            self.pools[pool] = bool(await rows("pool_get", {"name": pool}, self.conn))
        if not self.pools[pool]:
            return UnknownPool(pool)
        if (pool, tenant) not in self.bands:
            band = await rows("tenant_band_get", {"pool": pool, "tenant": tenant}, self.conn)
            lo, hi = ((band[0]["priority_min"], band[0]["priority_max"]) if band
                      else (None, None))
            self.bands[pool, tenant] = (bounds.PRIORITY_MIN if lo is None else lo,
                                        bounds.PRIORITY_MAX if hi is None else hi)
        lo, hi = self.bands[pool, tenant]
        if not lo <= priority <= hi:
            # Refused, not clamped: a clamped priority would silently reorder
            # the tenant's runs in a way it did not ask for.
            return ValidationError(
                "priority", f"must be between {lo} and {hi} for tenant {tenant!r} in pool "
                            f"{pool!r} (the band an admin set), got {priority}")
        if key is not None:
            found = await rows("run_get_by_keys", {"pool": pool, "tenant": tenant,
                                                   "keys": [key]}, self.conn)
            if found:
                return IdempotencyConflict(found[0]["id"], key)
        return None


async def enqueue_outcomes(store: Executor, conn: Conn | None, params: Mapping[str, Any],
                   found: Callable[[Any, str, str, str | None], T | None]
                   ) -> list[T | RunleaseError]:
    """Each run of an enqueue's parameters: what `found(id, pool, tenant,
    key)` makes of the statement's rows for it, or why it has none."""
    out: list[T | RunleaseError] = []
    explain = Explainer(store, conn)
    for run_id, pool, tenant, key, priority in zip(
            params["ids"], params["pools"], params["tenants"], params["keys"],
            params["priorities"], strict=True):
        outcome = found(run_id, pool, tenant, key)
        if outcome is not None:
            out.append(outcome)
            continue
        exc = await explain.why(pool, tenant, key, priority)
        if exc is None:
            raise RunleaseError(f"enqueue returned no row for run {run_id}")
        out.append(exc)
    return out
