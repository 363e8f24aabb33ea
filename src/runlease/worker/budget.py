"""A run's budget across attempts, kept in the database so a retried run
resumes with what is left.

Tokens and cost are real spend: each report is added to the run's row
(fenced by the lease, summed over every attempt) and the totals come back;
a total over max_tokens or max_cost raises BudgetExceeded, which ends the run
dead (`budget_exceeded`) at once. Turns and tool calls are ordinals, as
durable steps replay them: attempt 2 replaying turns 1-3 from their stored
steps is not three new turns, so an attempt counts from 1 again and the row
keeps the highest count any attempt reached (what the run page shows).
deadline_s is wall time since submit: the database's clock at the claim
says how much of it earlier attempts and the queue used.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from runlease.clock import Clock
from runlease.core.bounds import Budget, check_usage
from runlease.db.models import Lease
from runlease.db.store import RunStore
from runlease.db.usage import Usage
from runlease.worker.errors import BudgetExceeded

T = TypeVar("T")
Write = Callable[[Callable[[], Awaitable[T]]], Awaitable[T]]


class BudgetKeeper:
    def __init__(self, lease: Lease, store: RunStore, *, write: Write[Usage], clock: Clock,
                 started: float) -> None:
        self.budget = Budget.parse(lease.run.budget_json)
        self._lease = lease
        self._store = store
        self._write = write
        self._clock = clock
        self._started = started
        # The claim stamps updated_at with the database's now: how long the
        # run had existed when this attempt began, by the database's clock.
        self._age_at_claim = max(0.0, (lease.run.updated_at
                                       - lease.run.created_at).total_seconds())
        # A first lease has nothing recorded before it; later ones load it.
        self.usage: Usage | None = Usage() if lease.epoch == 1 else None
        self.turns = 0  # this attempt's, replays included
        self.tool_calls = 0
        self._written = (0, 0)

    @property
    def deadline_left_s(self) -> float | None:
        if self.budget.deadline_s is None:
            return None
        return (self.budget.deadline_s - self._age_at_claim
                - (self._clock.monotonic() - self._started))

    async def start(self) -> None:
        """Before the agent runs: whether earlier attempts left anything of
        a token or cost budget (BudgetExceeded if not); read only for such a
        budget on a later attempt."""
        self.check_deadline()
        if self.usage is None and (self.budget.max_tokens is not None
                                   or self.budget.max_cost is not None):
            self.usage = await self._write(lambda: self._store.run_usage(self._lease.run_id))
        if self.usage is not None:
            self._check(self.usage)

    def check_deadline(self) -> None:
        left = self.deadline_left_s
        if left is not None and left <= 0:
            raise BudgetExceeded(f"deadline of {self.budget.deadline_s} s since submit exceeded")

    def count_tool_call(self) -> int:
        """Count one tool call (written with the next record); raises past
        max_tool_calls."""
        self.tool_calls += 1
        limit = self.budget.max_tool_calls
        if limit is not None and self.tool_calls > limit:
            raise BudgetExceeded(f"max_tool_calls of {limit} exceeded")
        return self.tool_calls

    def begin_turn(self) -> int:
        """Count one turn (written with the next record); raises past max_turns."""
        self.turns += 1
        limit = self.budget.max_turns
        if limit is not None and self.turns > limit:
            raise BudgetExceeded(f"max_turns of {limit} exceeded")
        return self.turns

    async def record(self, input_tokens: int = 0, output_tokens: int = 0,
                     cost: float = 0.0) -> Usage:
        """Add usage (and the counts not written yet) to the run's totals;
        raises BudgetExceeded when a total is over the budget. Negative, NaN
        or huge values raise ValidationError and write nothing."""
        input_tokens, output_tokens, cost = check_usage(input_tokens, output_tokens, cost)
        counts = (self.turns, self.tool_calls)
        usage = await self._write(lambda: self._store.record_usage(
            self._lease, input_tokens=input_tokens, output_tokens=output_tokens, cost=cost,
            turns=counts[0], tool_calls=counts[1]))
        self._written = counts
        self.usage = usage
        self._check(usage)
        return usage

    @property
    def synced(self) -> bool:
        """Every count is written (sync would write nothing)."""
        return (self.turns, self.tool_calls) == self._written

    async def sync(self) -> None:
        """Write counts not written yet (at the end of an attempt)."""
        if (self.turns, self.tool_calls) != self._written:
            await self.record()

    def _check(self, usage: Usage) -> None:
        b = self.budget
        if b.max_tokens is not None and usage.tokens > b.max_tokens:
            raise BudgetExceeded(f"max_tokens of {b.max_tokens} exceeded "
                                 f"({usage.tokens} used over all attempts)")
        if b.max_cost is not None and usage.cost > b.max_cost:
            raise BudgetExceeded(f"max_cost of {b.max_cost:g} exceeded "
                                 f"({usage.cost:g} used over all attempts)")
