"""Concurrency keys (statements in sql/keys.sql, migration 0017): a pool
limits how many runs of one (tenant, key) hold a slot at once, e.g. at most
2 runs per end user of a tenant, or 1 per repository (ARCHITECTURE
invariant 5, generalised from tenants to keys).

    submit    the run joins its key: a slot if the key is under its limit,
              parked (out of every claim path) otherwise
    release   a run that held a slot finishes -> the key's oldest parked run
              takes the slot (runlease_key_release, a trigger)
    refill    a pool's limits raised -> parked runs take the free slots now

A key's row lock serializes its submits and hand-overs, so the runs holding
a slot never pass the limit, and only those can be claimed: never more than
L runs of a key are leased, however many workers claim. Lowering a limit
lets the runs already holding slots finish; none is stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from uuid import UUID

from runlease.core import bounds
from runlease.db.executor import Conn
from runlease.db.models import Run
from runlease.db.runs import QueueStore
from runlease.db.stats import TOP_KEYS
from runlease.errors import ValidationError

DEFAULT_KEY = "*"  # the pool's default per-key limit, in agent_run_key_limits
KEY_LIMIT_MAX = 100_000
MAX_KEY_LIMITS = 1000  # named keys per pool
REFILL_BATCH = 1000  # keys per refill statement


@dataclass(frozen=True, slots=True)
class KeyWaiting:
    """A key with runs parked for a slot: how many wait, how many hold one."""

    tenant_id: str
    key: str
    waiting: int
    active: int


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A pool's limits per key: `default` for every key (None: unlimited),
    `keys` a key's own limit, or a pattern's ("user-*": each key it matches
    has that limit; a key's own beats the longest pattern it matches, which
    beats the default)."""

    default: int | None = None
    keys: dict[str, int] = field(default_factory=dict)


def check_key(value: object) -> str:
    return bounds.check_key("concurrency_key", value)


def check_key_limit_name(value: object) -> str:
    """A key a limit names, or a pattern of keys ("user-*")."""
    return bounds.check_key_pattern("key_limits", value)


def _check_limit(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (
            1 <= value <= KEY_LIMIT_MAX):
        raise ValidationError(name, f"must be a whole number from 1 to {KEY_LIMIT_MAX} "
                                    "(leave a key out for no limit)")
    return value


def checked_key_limits(limits: KeyLimits) -> KeyLimits:
    """`limits` if valid (each limit 1 to KEY_LIMIT_MAX, keys a key's form),
    else the ValidationError naming the first fault."""
    if limits.default is not None:
        _check_limit("default_key_limit", limits.default)
    if not isinstance(limits.keys, dict) or len(limits.keys) > MAX_KEY_LIMITS:
        raise ValidationError("key_limits", f"at most {MAX_KEY_LIMITS} keys")
    for key, value in limits.keys.items():
        check_key_limit_name(key)
        _check_limit(f"key_limits.{key}", value)
    return limits


class KeyStore(QueueStore):
    """Concurrency keys: a run joins one, a pool sets their limits."""

    async def join_key(self, run_id: UUID, key: str, *, conn: Conn) -> Run:
        """A run just inserted, on `conn` in its transaction, joins its key:
        it holds a slot, or waits parked for one."""
        await self._rows("key_join", {"id": run_id, "key": check_key(key)}, conn)
        return await self.get(run_id, conn=conn)

    async def key_limits(self, pool: str, *, conn: Conn | None = None) -> KeyLimits:
        rows = await self._rows("key_limits_get", {"pool": bounds.check_pool(pool)}, conn)
        limits = {r["key"]: r["max_in_flight"] for r in rows}
        return KeyLimits(limits.pop(DEFAULT_KEY, None), limits)

    async def replace_key_limits(self, pool: str, limits: KeyLimits, *,
                                 conn: Conn | None = None) -> int:
        """The pool's key limits become exactly these; parked runs take the
        slots a raise frees, now. Returns how many runs that unparked."""
        bounds.check_pool(pool)
        limits = checked_key_limits(limits)
        wanted = dict(limits.keys)
        if limits.default is not None:
            wanted[DEFAULT_KEY] = limits.default
        moved = 0
        async with self.connection(conn) as c, c.transaction():
            await self._rows("key_limits_clear", {"pool": pool}, c)
            await self._rows("key_limits_replace", {"pool": pool, "limits": json.dumps(wanted)}, c)
            while True:
                (row,) = await self._rows("key_refill", {"pool": pool, "batch": REFILL_BATCH}, c)
                moved += int(row["moved"])
                if not row["moved"]:
                    return moved

    async def key_usage(self, pool: str, tenant_id: str, key: str, *,
                        conn: Conn | None = None) -> tuple[int, int]:
        """(runs holding a slot, runs parked) of a tenant's key."""
        (row,) = await self._rows("key_active", {"pool": bounds.check_pool(pool),
                                                 "tenant": bounds.check_tenant(tenant_id),
                                                 "key": check_key(key)}, conn)
        return int(row["active"]), int(row["parked"])

    async def key_waiting_counted(self, pool: str, tenant_id: str, key: str, *,
                                  conn: Conn | None = None) -> int:
        """The key's parked runs as counted (agent_run_keys.waiting, what
        the gauge reads); key_usage reads them."""
        (row,) = await self._rows("key_active", {"pool": bounds.check_pool(pool),
                                                 "tenant": bounds.check_tenant(tenant_id),
                                                 "key": check_key(key)}, conn)
        return int(row["waiting"])

    async def keys_waiting(self, pool: str, *, limit: int = TOP_KEYS,
                           conn: Conn | None = None) -> list[KeyWaiting]:
        """The pool's `limit` keys with the most runs parked for a slot."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise ValidationError("limit", "must be between 1 and 1000")
        rows = await self._rows("keys_waiting_top", {"pool": bounds.check_pool(pool),
                                                     "limit": limit}, conn)
        return [KeyWaiting(r["tenant_id"], r["key"], int(r["waiting"]), int(r["active"]))
                for r in rows]
