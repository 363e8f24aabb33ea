"""A submit that names a thread, a concurrency key, a singleton or a
debounce (issue 27), whoever makes it: a single submit, a batch item or a
schedule's tick. One entry point, so each path follows the same rules in
the caller's transaction (after its rate and quota are admitted):

    thread_id        db/threads.py     the thread's row lock; multitask policy
    singleton        db/singletons.py  the key's row lock; skip or cancel
    debounce         db/singletons.py  the key's row lock; the pending run takes it
    concurrency_key  db/keys.py        the run joins its key (slot or parked)

A batch (or a scheduler's batch of ticks) takes several such rows in one
transaction: `lock_keyed` locks them all first, in one global order, so two
batches naming the same threads or keys in another order never wait for
each other in a cycle. The interrupts a submit asks for (multitask
interrupt/rollback, singleton cancel_in_progress) are made after the commit
(db/threads.py says why).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from runlease.core import bounds
from runlease.db.executor import Conn
from runlease.db.keys import KeyStore, check_key
from runlease.db.models import EnqueueResult
from runlease.db.runs import NewRun
from runlease.db.singletons import Debounce, OnConflict, SingletonStore
from runlease.db.threads import Multitask, ThreadStore, ThreadSubmit
from runlease.errors import ValidationError

KEYED_FIELDS = ("thread_id", "concurrency_key", "singleton", "debounce")


@dataclass(frozen=True, slots=True, kw_only=True)
class Keyed:
    """What names a run's thread or key: at most one of the four."""

    thread_id: str | None = None
    multitask: str | None = None
    concurrency_key: str | None = None
    singleton_key: str | None = None
    on_conflict: str = "skip"
    debounce: Debounce | None = None

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Keyed | None:
        """From a submit body's or a template's fields (None: none given).
        Checked: one at most, each in its form (a ValidationError names it)."""
        given = [n for n in KEYED_FIELDS if fields.get(n) is not None]
        multitask = fields.get("multitask")
        if multitask is not None and fields.get("thread_id") is None:
            raise ValidationError("multitask", "goes with thread_id")
        if not given:
            return None
        if multitask is not None and multitask not in {m.value for m in Multitask}:
            raise ValidationError("multitask", "must be one of "
                                  + ", ".join(m.value for m in Multitask))
        if len(given) > 1:
            raise ValidationError(given[1], f"give one of {', '.join(given)}, not several")
        singleton = fields.get("singleton")
        debounce = fields.get("debounce")
        if singleton is not None and not isinstance(singleton, Mapping):
            raise ValidationError("singleton", "must be an object {key, on_conflict}")
        if debounce is not None and not isinstance(debounce, Mapping):
            raise ValidationError("debounce", "must be an object {key, window_s, max_delay_s}")
        on_conflict = (singleton.get("on_conflict") or "skip") if singleton else "skip"
        if on_conflict not in {p.value for p in OnConflict}:
            raise ValidationError("singleton.on_conflict", "must be skip or cancel_in_progress")
        return cls(
            thread_id=(bounds.check_thread(fields["thread_id"])
                       if fields.get("thread_id") is not None else None),
            multitask=multitask,
            concurrency_key=(check_key(fields["concurrency_key"])
                             if fields.get("concurrency_key") is not None else None),
            singleton_key=(bounds.check_key("singleton.key", singleton.get("key"))
                           if singleton is not None else None),
            on_conflict=on_conflict,
            debounce=(Debounce(debounce.get("key", ""), debounce.get("window_s", 0),
                               debounce.get("max_delay_s", 0)).checked()
                      if debounce is not None else None))

    def lock_name(self) -> tuple[str, str]:
        """Its row's kind and key, for the global lock order."""
        if self.thread_id is not None:
            return "thread", self.thread_id
        if self.singleton_key is not None:
            return "singleton", self.singleton_key
        if self.debounce is not None:
            return "debounce", self.debounce.key
        return "key", self.concurrency_key or ""


class KeyedStore(SingletonStore, KeyStore, ThreadStore):
    """Submits with a thread, a key, a singleton or a debounce."""

    async def lock_keyed(self, items: Iterable[tuple[str, str, Keyed]], *,
                         conn: Conn) -> None:
        """Lock the rows of every (pool, tenant, keyed) in one order: threads,
        then singletons, debounces, keys, each by (pool, tenant, key). Each
        later submit of the same row re-takes a lock this transaction holds."""
        # A thread is the tenant's in every pool: its row's name has no pool.
        wanted = sorted({(k.lock_name()[0], "" if k.thread_id is not None else pool, tenant,
                          k.lock_name()[1]) for pool, tenant, k in items})
        for kind, pool, tenant, key in wanted:
            where = {"pool": pool, "tenant": tenant, "key": key}
            if kind == "thread":
                await self._rows("thread_lock", {"tenant": tenant, "thread": key}, conn)
            elif kind == "singleton":
                await self._rows("singleton_lock", where, conn)
            elif kind == "debounce":
                await self._rows("debounce_lock", where, conn)
            else:
                await self._rows("key_lock", where, conn)

    async def submit_keyed(self, pool: str, run: NewRun, keyed: Keyed | None, *,
                           conn: Conn) -> ThreadSubmit:
        """Enqueue `run` under its thread or key rule, in the caller's
        transaction on `conn`; `interrupt`: the run to stop once it committed
        (ThreadStore.interrupt, outside the transaction)."""
        if keyed is None:
            (result,) = await self.enqueue_many(pool, [run], notify=False, conn=conn)
            return ThreadSubmit(result)
        if keyed.thread_id is not None:
            return await self.submit_to_thread(pool, run, keyed.thread_id,
                                               keyed.multitask or "enqueue", conn=conn)
        if keyed.singleton_key is not None:
            return await self.submit_singleton(pool, run, keyed.singleton_key,
                                               keyed.on_conflict, conn=conn)
        if keyed.debounce is not None:
            return ThreadSubmit(await self.submit_debounced(pool, run, keyed.debounce,
                                                            conn=conn))
        (result,) = await self.enqueue_many(pool, [run], notify=False, conn=conn)
        if keyed.concurrency_key is not None and result.inserted:
            result = EnqueueResult(
                await self.join_key(result.run.id, keyed.concurrency_key, conn=conn), True)
        return ThreadSubmit(result)
