"""Child runs from agent code: ctx.submit_child and ctx.wait_children.

A child is submitted in a durable step (replayed, not resubmitted, on a
later attempt) with an idempotency key drawn from the parent and the step,
so even a child enqueued by an attempt that died before committing its step
is found again, not duplicated. wait_children returns the children's
outcomes once every child has finished; until then it raises
WaitForChildren, and the worker hands the run back (`wait` transition,
db/children.py): no slot is held while the children run, no attempt is
charged, and the agent is run again from the top once they are done (its
steps replayed, wait_children then returning at once).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from runlease.core.states import TERMINAL
from runlease.db.models import Lease
from runlease.db.rates import Throttled
from runlease.db.store import RunStore
from runlease.errors import RunleaseError
from runlease.worker.errors import RetryableError

T = TypeVar("T")
Step = Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]
Write = Callable[[Callable[[], Awaitable[T]]], Awaitable[T]]


class WaitForChildren(RunleaseError):
    """Raised by wait_children while a child is unfinished: let it propagate;
    the worker parks the run until its children are done."""


class Children:
    def __init__(self, lease: Lease, store: RunStore, step: Step, write: Write[Any]) -> None:
        self._lease = lease
        self._store = store
        self._step = step
        self._write = write
        self._n = 0

    async def submit(self, input: Mapping[str, Any], *, key: str | None = None,  # noqa: A002
                     pool: str | None = None, priority: int = 0,
                     max_attempts: int | None = None,
                     budget: Mapping[str, Any] | None = None) -> str:
        self._n += 1
        key = key if key is not None else str(self._n)

        async def submit() -> str:
            try:
                run = await self._write(lambda: self._store.submit_child(
                    self._lease, input, key=key, pool=pool, priority=priority,
                    max_attempts=max_attempts, budget=budget))
            except Throttled as exc:
                # The tenant's rate or queue quota (issue 32): uncaught, the
                # parent is retried once the wait is over, as for a 429.
                raise RetryableError(str(exc), code=exc.code,
                                     retry_after_s=exc.retry_s) from None
            return str(run.id)

        child_id: str = await self._step(f"child:{key}", submit)
        return child_id

    async def wait(self) -> list[dict[str, Any]]:
        outcomes = await self._write(lambda: self._store.children_outcomes(self._lease.run_id))
        if any(o.status not in TERMINAL for o in outcomes):
            raise WaitForChildren(f"{sum(o.status not in TERMINAL for o in outcomes)} of "
                                  f"{len(outcomes)} children unfinished")
        return [o.to_json() for o in outcomes]
