"""Group commit for single submits: concurrent POST /v1/runs share one
transaction and one INSERT.

Each submit alone costs a transaction of four round trips (BEGIN, the rate
lock, the INSERT, COMMIT) and a WAL flush at its commit; under 32 concurrent
clients the API spent its time on those and the database on the flushes. So
a submit joins a group: the submits made in one turn of the event loop start
a group together, and whatever arrives while MAX_IN_FLIGHT groups are being
written waits for the next group, which takes every submit waiting (at most
MAX_GROUP). A lone submit waits for nothing but the rest of its turn.

Each submit keeps its own answer, as if it had been made alone:
- the tenant's rate stays exact: per (pool, tenant) of the group, under the
  tenant's submit lock, as many as fit are admitted in arrival order, the
  rest get the 429 a single submit over the rate gets;
- a refused run (invalid, unknown pool, priority outside the band, an
  idempotency conflict) fails alone: the INSERT writes the others;
- a submit whose idempotency key is in a group being written waits for the
  next group (it finds the first's run, as it would one after the other);
- if the group's statement fails for another reason, each of its submits
  is made again alone, so one bad run cannot fail its neighbours.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

from runlease.api.rates import throttled
from runlease.core import bounds
from runlease.db.models import EnqueueResult
from runlease.db.rates import Throttled
from runlease.db.runs import NewRun
from runlease.db.store import Conn, RunStore
from runlease.errors import DatabaseUnavailable, RunleaseError, ValidationError

log = logging.getLogger(__name__)

MAX_GROUP = 64
MAX_IN_FLIGHT = 2

Outcome = EnqueueResult | RunleaseError | Exception


@dataclass(eq=False)
class _Submit:
    run: NewRun
    done: asyncio.Future[EnqueueResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def key(self) -> tuple[str, str, str] | None:
        key = self.run.idempotency_key
        return None if key is None else (self.run.pool or "", self.run.tenant_id, key)

    def settle(self, outcome: Outcome) -> None:
        if self.done.done():
            return
        if isinstance(outcome, EnqueueResult):
            self.done.set_result(outcome)
        else:
            self.done.set_exception(outcome)


class SubmitGroups:
    """Owns the groups' tasks; `close()` waits for those in flight."""

    def __init__(self, store: RunStore, *, max_group: int = MAX_GROUP,
                 max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.store = store
        self.max_group = max_group
        self.max_in_flight = max_in_flight
        self._waiting: list[_Submit] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._soon = False
        self._keys_in_flight: set[tuple[str, str, str]] = set()
        self.groups = 0  # groups written, for tests and the bench
        self.largest = 0

    async def submit(self, run: NewRun) -> EnqueueResult:
        """Enqueue one run (its pool named) with others arriving meanwhile;
        its own result, or its own error raised."""
        assert run.pool is not None
        item = _Submit(run)
        # A client gone before its answer leaves the outcome to nobody.
        item.done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._waiting.append(item)
        if not self._soon:
            # After whatever else is ready in this turn of the loop (requests
            # read together), so that those submits can share the group.
            self._soon = True
            asyncio.get_running_loop().call_soon(self._start)
        # Not cancelled with the request: the group writes it anyway, and
        # its answer must not go to a cancelled future.
        return await asyncio.shield(item.done)

    async def close(self) -> None:
        """Wait for the groups being written (each within a few seconds)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)
            for task in self._tasks:
                task.cancel()

    def _start(self) -> None:
        self._soon = False
        while self._waiting and len(self._tasks) < self.max_in_flight:
            group = self._take()
            if not group:  # each waits for its key's group: started when that ends
                return
            task = asyncio.get_running_loop().create_task(self._write(group),
                                                          name="runlease-submit-group")
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._start()

    def _take(self) -> list[_Submit]:
        group: list[_Submit] = []
        rest: list[_Submit] = []
        for item in self._waiting:
            key = item.key
            if len(group) >= self.max_group or (key is not None
                                                and key in self._keys_in_flight):
                rest.append(item)
                continue
            if key is not None:
                self._keys_in_flight.add(key)
            group.append(item)
        self._waiting = rest
        return group

    async def _write(self, group: list[_Submit]) -> None:
        try:
            await self._write_group(group)
        finally:
            self._keys_in_flight.difference_update(
                item.key for item in group if item.key is not None)

    async def _write_group(self, group: list[_Submit]) -> None:
        self.groups += 1
        self.largest = max(self.largest, len(group))
        try:
            outcomes = await self._in_one_transaction(group)
        except DatabaseUnavailable as exc:
            for item in group:
                item.settle(exc)
            return
        except RunleaseError as exc:
            if len(group) == 1:
                group[0].settle(exc)
                return
            log.warning("submit_group_failed runs=%d error=%s; each made alone", len(group), exc)
            await asyncio.gather(*(self._write_group([item]) for item in group))
            return
        except BaseException as exc:  # cancelled at shutdown: nobody waits forever
            for item in group:
                item.settle(RunleaseError(f"submit not made: {exc!r}"))
            raise
        for item, outcome in zip(group, outcomes, strict=True):
            item.settle(outcome)

    async def _in_one_transaction(self, group: list[_Submit]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(group)
        async with self.store.connection() as conn, conn.transaction():
            todo = list(range(len(group)))
            while todo:
                admitted, refused = await self._admit(conn, [group[i].run for i in todo])
                results = await self.store.enqueue_each(
                    [group[todo[j]].run for j in admitted], conn=conn)
                for j, result in zip(admitted, results, strict=True):
                    outcomes[todo[j]] = result
                unused = any(not (isinstance(r, EnqueueResult) and r.inserted)
                             for r in results)
                if refused and admitted and unused:
                    # A run admitted by the rate wrote nothing (refused, or
                    # an earlier run's key): its place may go to the next.
                    todo = [todo[j] for j in refused]
                    continue
                for j, exc in refused.items():
                    outcomes[todo[j]] = exc
                break
        assert all(o is not None for o in outcomes)
        return [o for o in outcomes if o is not None]

    async def _admit(self, conn: Conn, runs: list[NewRun]
                     ) -> tuple[list[int], dict[int, Exception]]:
        """Which runs the tenants' rates admit now, in order, and the 429 of
        each other one. The locks are taken in one order (as a batch takes
        them), so two groups never wait on each other in a cycle."""
        wanted = Counter((r.pool or "", r.tenant_id) for r in runs)
        room: dict[tuple[str, str], int] = {}
        why: dict[tuple[str, str], Throttled | None] = {}
        invalid: dict[tuple[str, str], ValidationError] = {}
        for pool, tenant in sorted(wanted):
            try:  # as a single submit's rate check would refuse it
                bounds.check_pool(pool)
                bounds.check_tenant(tenant)
            except ValidationError as exc:
                invalid[pool, tenant] = exc
                continue
            admitted_room = await self.store.admit(pool, tenant, wanted[pool, tenant], conn=conn)
            room[pool, tenant], why[pool, tenant] = admitted_room.n, admitted_room.refusal
        admitted: list[int] = []
        refused: dict[int, Exception] = {}
        for i, r in enumerate(runs):
            lane = (r.pool or "", r.tenant_id)
            if lane in invalid:
                refused[i] = invalid[lane]
            elif room[lane] > 0:
                room[lane] -= 1
                admitted.append(i)
            else:
                refusal = why[lane]
                assert refusal is not None
                refused[i] = throttled(refusal)
        return admitted, refused
