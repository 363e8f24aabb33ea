"""Singletons and debounce (statements in sql/singletons.sql, migration
0017, issue 27): a submit that names a key may be answered with the key's
existing run instead of a new one. Each key's row is locked for the
submit's transaction, so concurrent submits of one key never make two runs
where one is promised.

    singleton skip                a run of the key pending or active -> that run
    singleton cancel_in_progress  the key's unfinished run is cancelled (after
                                  the commit, as a thread's interrupt) and the
                                  new run starts at once
    debounce                      a run of the key still pending -> it takes
                                  the new input and starts window_s later, never
                                  past max_delay_s after the first submit
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from runlease.core import bounds
from runlease.db.executor import Conn
from runlease.db.models import EnqueueResult, Run
from runlease.db.runs import NewRun, QueueStore
from runlease.db.threads import ThreadSubmit
from runlease.errors import ValidationError

WINDOW_S_MAX = 24 * 3600
MAX_DELAY_S_MAX = 7 * 24 * 3600


class OnConflict(StrEnum):
    SKIP = "skip"
    CANCEL_IN_PROGRESS = "cancel_in_progress"


@dataclass(frozen=True, slots=True)
class Debounce:
    """Submits of `key` within `window_s` of each other make one run (the
    last input wins), started at most `max_delay_s` after the first."""

    key: str
    window_s: float
    max_delay_s: float

    def checked(self) -> Debounce:
        bounds.check_key("debounce.key", self.key)
        for name, value, top in (("window_s", self.window_s, WINDOW_S_MAX),
                                 ("max_delay_s", self.max_delay_s, MAX_DELAY_S_MAX)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    0 < value <= top):
                raise ValidationError(f"debounce.{name}",
                                      f"must be more than 0 and at most {top} seconds")
        if self.max_delay_s < self.window_s:
            raise ValidationError("debounce.max_delay_s", "must be at least window_s")
        return self


class SingletonStore(QueueStore):
    """Submits answered with a key's existing run."""

    async def submit_singleton(self, pool: str, run: NewRun, key: str,
                               on_conflict: OnConflict | str = OnConflict.SKIP, *,
                               conn: Conn) -> ThreadSubmit:
        """Enqueue `run` as the key's singleton, in the caller's transaction
        on `conn`; `interrupt`: the run to cancel once it committed
        (QueueStore.request_cancel, outside the transaction)."""
        key = bounds.check_key("singleton.key", key)
        try:
            policy = OnConflict(on_conflict)
        except ValueError:
            raise ValidationError("singleton.on_conflict",
                                  "must be skip or cancel_in_progress") from None
        tenant = bounds.check_tenant(run.tenant_id)
        where = {"pool": bounds.check_pool(pool), "tenant": tenant, "key": key}
        (lock,) = await self._rows("singleton_lock", where, conn)
        existing = lock["run_id"]
        is_open = existing is not None and (await self._rows(
            "singleton_open", {"id": existing}, conn))[0]["open"]
        if is_open and policy is OnConflict.SKIP:
            return ThreadSubmit(EnqueueResult(await self.get(existing, conn=conn), False))
        (result,) = await self.enqueue_many(pool, [run], notify=False, conn=conn)
        if result.inserted:
            await self._rows("singleton_set", where | {"id": result.run.id}, conn)
        return ThreadSubmit(result, existing if is_open and result.inserted else None)

    async def submit_debounced(self, pool: str, run: NewRun, debounce: Debounce, *,
                               conn: Conn) -> EnqueueResult:
        """Enqueue `run` debounced, in the caller's transaction on `conn`: the
        key's pending run takes its input (inserted False, the same run), or
        a new run starts window_s from now."""
        debounce = debounce.checked()
        if run.run_at is not None or run.delay_s is not None:
            raise ValidationError("debounce", "decides the start: not with run_at or delay_s")
        tenant = bounds.check_tenant(run.tenant_id)
        where = {"pool": bounds.check_pool(pool), "tenant": tenant, "key": debounce.key}
        (lock,) = await self._rows("debounce_lock", where, conn)
        if lock["run_id"] is not None:
            text = bounds.check_object("input", run.input, self.max_input_bytes)
            rows = await self._rows("debounce_replace", {
                "id": lock["run_id"], "input": text, "window_s": float(debounce.window_s),
                "first_at": lock["first_at"], "max_delay_s": float(debounce.max_delay_s)}, conn)
            if rows:
                return EnqueueResult(Run.from_row(rows[0]), False)
        run.delay_s = float(debounce.window_s)
        (result,) = await self.enqueue_many(pool, [run], notify=False, conn=conn)
        if result.inserted:
            await self._rows("debounce_set", where | {"id": result.run.id}, conn)
        return result
