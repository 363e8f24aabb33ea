"""One attempt of one run on a worker: its lease, its agent's task, its
tools, and why it stops (the stop reasons: worker/runner.py)."""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

from runlease import metrics
from runlease.clock import Clock, SystemClock
from runlease.core.states import Outcome
from runlease.db.models import Lease
from runlease.worker.incarnation import Incarnation
from runlease.worker.sandbox import Sandbox
from runlease.worker.toolenv import run_vars
from runlease.worker.tools import ToolRunner
from runlease.worker.waits import Flag

log = logging.getLogger(__name__)


class StopReason(enum.Enum):
    CANCEL = "cancel"
    DRAIN = "drain"
    LEASE_LOST = Outcome.LEASE_LOST.value
    SELF_FENCED = Outcome.SELF_FENCED.value
    DEADLINE = "deadline"


@dataclass(frozen=True)
class AttemptTerms:
    """What every attempt on one worker is held to: the same for all, so the
    worker builds it once (from its settings and its pool's row)."""

    lease_s: float
    margin_s: float
    cancel_grace_s: float
    kill_grace_s: float
    tool_grant: frozenset[str] = frozenset()
    # The worker's monotonic clock, which alone judges the fence (a
    # ManualClock in tests, so the fence is driven without sleeping).
    clock: Clock = field(default_factory=SystemClock)
    # Tools in a sandbox (worker/sandbox.py); without one, only tool_tenant's
    # runs may run tools (None: any tenant's, an admin's opt-in).
    sandbox: Sandbox | None = None
    tool_tenant: str | None = None
    # With tracing on, a tool's span names its arguments (redacted): the
    # pool's opt-in (settings: trace_tool_arguments).
    trace_tool_arguments: bool = False

    def tools_refused(self, tenant: str) -> str | None:
        if self.sandbox is None and self.tool_tenant not in (None, tenant):
            return "this pool's workers run tools unsandboxed for another tenant only"
        return None

    @cached_property
    def fence_after_s(self) -> float:
        """Self-fencing: how long after a renewal of the incarnation (or its
        registration) was sent its runs stop, before the lease could expire
        (the database set expires_at after the send)."""
        return self.lease_s - self.margin_s


class RunHandle:
    """One attempt of one run on this worker: its lease, its agent task, its
    tools, and why it stops. Every write for the attempt goes through its own
    handle, never through a lookup by run id: after a reclaim, two handles of
    one run exist (the old one unwinding, the new one waiting for it)."""

    def __init__(
        self,
        lease: Lease,
        terms: AttemptTerms,
        *,
        claimed_at: float,
        previous: RunHandle | None = None,
        incarnation: Incarnation | None = None,
    ) -> None:
        """`incarnation`: the worker incarnation the run was claimed as, whose
        lease is this run's (one of its own, fenced from claimed_at, when
        none is given: a handle made outside a worker)."""
        self.lease = lease
        self.terms = terms
        self.claimed_at = claimed_at
        self.incarnation = incarnation or Incarnation(
            lease.worker, claimed_at + terms.fence_after_s)
        # The run id as text, made once: task names and the tools' env use it.
        self.rid = str(lease.run_id)
        self.cancel = asyncio.Event()
        self.tools = ToolRunner(self.cancel, terms.kill_grace_s, grant=terms.tool_grant,
                                run_env=partial(run_vars, self.rid, lease.run.attempts,
                                                lease.epoch),
                                sandbox=terms.sandbox, run_name=f"{self.rid}-{lease.epoch}",
                                refused=terms.tools_refused(lease.run.tenant_id),
                                trace_arguments=terms.trace_tool_arguments)
        self.reason: StopReason | None = None
        self.task: asyncio.Task[Any] | None = None
        self.finished = Flag()
        # Set when this attempt has really ended (an abandoned agent task
        # included): only then may a newer attempt of the run start.
        self.ended = Flag()
        # The older attempt of the same run this one waits for, if any.
        self.previous = previous
        # Set by every stop and cancel: wakes an attempt waiting for `previous`.
        self.stopping = Flag()
        # Resolved when the lease is lost or self-fenced: whatever waits on the
        # run stops waiting. A future, not an Event, so racing it costs no task.
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Set once the final write (ack, nack...) is under way: a renewal that
        # finds no row then means that write committed, not that the lease was lost.
        self.closing = False
        # Set when the attempt's ending is taken in hand, by the quick way or
        # the full one (worker/runner.py): never both.
        self.settled = False
        # How the attempt ended (worker/runner.py records it): an attempt that
        # ended UNKNOWN wrote no ending, and its run is still leased.
        self.outcome: Outcome | None = None
        # The attempt's span while tracing is on (worker/attempt_trace.py).
        self.trace: Any = None
        self._killing: asyncio.Task[None] | None = None
        # Made when the agent first waits for a message (ctx.receive): set by
        # the inbox NOTIFY for this run (worker.py).
        self._inbox: asyncio.Event | None = None

    @property
    def run_id(self) -> Any:
        return self.lease.run_id

    @property
    def pool(self) -> str:
        return self.lease.run.pool

    @property
    def fence_at(self) -> float:
        """When, by the worker's clock, this run's lease could expire: its
        incarnation's fence (minus infinity once the incarnation is over)."""
        return self.incarnation.fence_at

    @property
    def writes_allowed(self) -> bool:
        return self.reason not in (StopReason.LEASE_LOST, StopReason.SELF_FENCED)

    @property
    def lease_lost(self) -> bool:
        """The lease is gone (lost or self-fenced): nothing more is written."""
        return not self.writes_allowed

    def may_write(self) -> bool:
        """Checked before every write: False once the lease is lost, or once
        the fence deadline has passed by this worker's own clock (then the
        attempt is self-fenced here, whoever noticed first), or once its
        incarnation is over (the lease keeper stops every run of it)."""
        if not self.writes_allowed or self.incarnation.over:
            return False
        now = self.terms.clock.monotonic()
        if now >= self.incarnation.fence_at:
            self.self_fence(now)
            return False
        return True

    def self_fence(self, now: float) -> None:
        """Stop: the lease could have expired by this worker's clock. The
        whole incarnation is over with it (the database knows one lease for
        all its runs: renewing it for the others would keep this run leased
        with nobody running it)."""
        if not self.writes_allowed:
            return
        metrics.child(metrics.SELF_FENCED, self.pool).inc()
        log.error("run_self_fenced run_id=%s since_renewal_s=%.2f", self.run_id,
                  now - (self.fence_at - self.terms.fence_after_s))
        self.stop(StopReason.SELF_FENCED)
        self.incarnation.end("self_fenced")

    def inbox_wake(self) -> asyncio.Event:
        if self._inbox is None:
            self._inbox = asyncio.Event()
        return self._inbox

    def poke_inbox(self) -> None:
        """A message was sent to the run: wake its agent if it waits for one."""
        if self._inbox is not None:
            self._inbox.set()

    def request_cancel(self) -> None:
        """The user's Stop reached this worker (NOTIFY or the heartbeat flag)."""
        if self.cancel.is_set() or self.reason is not None:
            return
        self.reason = StopReason.CANCEL
        self.cancel.set()
        self.stopping.set()
        metrics.child(metrics.CANCELS, self.pool).inc()
        log.info("run_cancel_requested run_id=%s", self.run_id)
        if self.task is not None:
            asyncio.get_running_loop().call_later(self.terms.cancel_grace_s, self._cancel_task)

    def stop(self, reason: StopReason) -> None:
        """Stop now: drain, lost lease, self-fencing or the deadline."""
        if self.reason in (StopReason.LEASE_LOST, StopReason.SELF_FENCED):
            return
        hard = reason in (StopReason.LEASE_LOST, StopReason.SELF_FENCED)
        if self.reason is None or hard:
            self.reason = reason
        self.stopping.set()
        if hard:
            # Kill the tools now, not when the agent's task gets round to it:
            # the task may be stuck on a dead socket.
            self.tools.hard = True
            if not self.lost.done():
                self.lost.set_result(None)
            self._killing = asyncio.ensure_future(self.tools.kill_all())
        log.log(logging.WARNING if reason != StopReason.DRAIN else logging.INFO,
                "run_stopping run_id=%s reason=%s", self.run_id, reason.value)
        self._cancel_task()

    def _cancel_task(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
