"""Which AgentRunPool a pool row belongs to.

A pool is named by its AgentRunPool's `spec.pool`, by default its
`metadata.name`; two AgentRunPools named `support` in namespaces `a` and
`b` would name one pool and share its queue, its tenant limits and each
other's settings. So a pool row records its owner, "namespace/name": the
first AgentRunPool to write it keeps it, and another one naming the same
pool is refused (Degraded, reason PoolTaken) until the owner is deleted or
one of them sets another `spec.pool`. Pools made through the API or CLI have
no owner; the first AgentRunPool naming one adopts it.
"""

from __future__ import annotations

from runlease.db.store import Conn, RunStore
from runlease.operator.spec import PoolSpec

REASON = "PoolTaken"


class PoolTaken(RuntimeError):
    """The pool belongs to another AgentRunPool."""


def key(spec: PoolSpec) -> str:
    return f"{spec.namespace}/{spec.name}"


def _taken(spec: PoolSpec, owner: str | None) -> PoolTaken:
    return PoolTaken(f"pool {spec.pool!r} belongs to AgentRunPool {owner}; this one "
                     f"({key(spec)}) is not reconciled: delete one of them or set "
                     f"spec.pool to another name")


async def claim(store: RunStore, spec: PoolSpec) -> None:
    """Own the pool or raise PoolTaken (before writing its settings)."""
    owner = await store.claim_pool_owner(spec.pool, key(spec))
    if owner != key(spec):
        raise _taken(spec, owner)


async def check(store: RunStore, spec: PoolSpec, conn: Conn | None = None) -> bool:
    """Whether the pool is this AgentRunPool's: a pass acts only on a pool its
    reconcile has claimed. False while nobody has (reconcile has not run, or
    failed); PoolTaken when another AgentRunPool has."""
    owner = await store.pool_owner(spec.pool, conn=conn)
    if owner is not None and owner != key(spec):
        raise _taken(spec, owner)
    return owner is not None


async def release(store: RunStore, spec: PoolSpec) -> None:
    await store.release_pool_owner(spec.pool, key(spec))
