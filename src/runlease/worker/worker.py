"""The worker process: claim loop, lease keeper, listener, acker, reaper, probes.

    claim loop    claims only for free slots (batched up to the number free),
                  on its own connection; wakes on the pool's NOTIFY, polls with
                  jitter as the fallback
    lease keeper  the worker's incarnation: registered, renewed once per interval
                  whatever the runs held (a run's lease is its incarnation's),
                  fenced by the worker's clock, replaced when it is over
    listener      its own session: the pool, cancel and inbox channels
    acker         acks of runs that finish together go out in one statement
    reaper        leader-elected through PostgreSQL; reap and retention
    probes        /metrics, /healthz, /readyz

SIGTERM or SIGINT drains: stop claiming at once, let runs finish within the
grace, then cancel and release the rest (attempts not charged), exit 0. A
second signal kills the tools and exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Coroutine
from typing import Any
from uuid import UUID

from runlease import logs, metrics
from runlease.clock import Clock, SystemClock
from runlease.core.redact import Redactor
from runlease.core.states import Outcome
from runlease.db.channels import CANCEL_CHANNEL, INBOX_CHANNEL, pool_channel
from runlease.db.connect import make_conn_pool
from runlease.db.models import Lease, Pool
from runlease.db.pooler import check_behind_pooler
from runlease.db.store import Rendered, RunStore
from runlease.db.workers import MAX_WORKER_ID_CHARS
from runlease.errors import RunleaseError, SettingsError
from runlease.services.http import ProbeServer
from runlease.services.identity import worker_id
from runlease.services.leader import LeaderElector
from runlease.services.listener import Listener
from runlease.services.reaper import Reaper
from runlease.services.scheduler import Scheduler
from runlease.services.webhooks import WebhookDispatcher
from runlease.settings import WorkerSettings, describe
from runlease.settings.worker import load_agent
from runlease.worker import sandbox, toolenv
from runlease.worker.acker import Acker
from runlease.worker.claimer import ClaimLoop
from runlease.worker.handle import AttemptTerms, RunHandle, StopReason
from runlease.worker.holder import LeaseHolder
from runlease.worker.incarnation import INCARNATION_SUFFIX_CHARS, Incarnation
from runlease.worker.lease_keeper import LeaseKeeper
from runlease.worker.runner import Agent, Runner

log = logging.getLogger(__name__)


class Worker:
    def __init__(
        self,
        settings: WorkerSettings,
        *,
        agent: Agent | None = None,
        identity: str | None = None,
        handle_signals: bool = True,
        tool_grant: frozenset[str] = frozenset(),
        seal_environ: bool = True,
        clock: Clock | None = None,
    ) -> None:
        """`tool_grant`: variables of the worker's environment its tools may
        see, besides what the pool's tool_env grants. `seal_environ` takes the worker's secrets
        out of os.environ at start (worker/toolenv.py); tests that run a
        Worker inside their own process turn it off. `clock` is the monotonic
        clock of the fence, heartbeats and drain (a ManualClock in tests)."""
        if not settings.database_url:
            raise SettingsError("no database: set --database-url, RUNLEASE_DATABASE_URL or "
                                "DATABASE_URL")
        self.settings = settings
        self.url: str = settings.database_url
        self.agent: Agent = agent or load_agent(settings.agent, settings.app_dir)
        # Each incarnation's id (its registry row, the runs' locked_by) is
        # this identity and a random part.
        self.identity = identity or worker_id()
        if len(self.identity) > MAX_WORKER_ID_CHARS - INCARNATION_SUFFIX_CHARS:
            raise SettingsError("the worker identity is over "
                                f"{MAX_WORKER_ID_CHARS - INCARNATION_SUFFIX_CHARS} characters")
        self.handle_signals = handle_signals
        self.tool_grant = tool_grant
        self.seal_environ = seal_environ
        self.clock: Clock = clock or SystemClock()
        # The current attempt of each run this worker holds, by run id...
        self.held: dict[UUID, RunHandle] = {}
        # ...and every attempt still executing, older attempts of a reclaimed
        # run included: what counts against concurrency and gets heartbeats.
        self.active: set[RunHandle] = set()
        # Cancel NOTIFYs for runs not started here (yet): one that overtakes
        # its claim's return is applied when the run starts.
        self._early_cancels: dict[UUID, float] = {}
        self.draining = False
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._done = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.claims: ClaimLoop | None = None
        self.holder: LeaseHolder | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self.started = asyncio.Event()

    # -- life cycle -------------------------------------------------------------------

    async def run(self) -> int:
        s = self.settings
        if self.seal_environ:  # before the first child process of any kind
            toolenv.seal([s.database_url, s.listen_database_url])
        s.check_tool_sandbox()
        try:
            self.sandbox = await asyncio.to_thread(sandbox.from_settings, s)
        except sandbox.SandboxUnavailable as exc:
            raise SettingsError(f"{describe('tool_sandbox')}: {exc}; or run tools "
                                f"unsandboxed with --no-tool-sandbox") from None
        if self.sandbox is None:
            log.warning("tool_sandbox_off pool=%s tenant=%s: tools run as the worker's "
                        "user, beside it", s.pool, s.tool_tenant or "any")
        conn_pool = make_conn_pool(self.url, min_size=1, max_size=min(s.concurrency, 20) + 2,
                                   prepare=s.prepared_statements,
                                   application_name="runlease-worker")
        await conn_pool.open(wait=False)
        redactor = Redactor(s.redact_patterns)
        logs.use_redactor(redactor)  # log lines pass the same rules as what is stored
        self.store = RunStore(conn_pool, redactor=redactor)
        try:
            # The pool row is the one source of the lease (claims, heartbeats
            # and the fence all use what it said at start) and of the
            # variables its tools may see.
            row = await self._check_pool()
            await check_behind_pooler(self.url, prepared=s.prepared_statements,
                                      listen=s.listen and not s.listen_database_url)
            s = self.settings = s.with_pool_lease(row.lease_s)
            self.tool_grant = self.tool_grant | frozenset(row.tool_env)
        except BaseException:
            await conn_pool.close()
            raise
        self.acker = Acker(self.store, pool=s.pool)
        self.runner = Runner(self.store, self.agent, ack=self._ack, spawn=self._spawn,
                             ended=self._ended)
        self.terms = AttemptTerms(s.lease_s, s.margin_s, s.cancel_grace_s, s.tool_kill_grace_s,
                                  self.tool_grant, self.clock, sandbox=self.sandbox,
                                  tool_tenant=(None if s.unsandboxed_pool == s.pool
                                               else s.tool_tenant),
                                  trace_tool_arguments=s.trace_tool_arguments)
        self.holder = holder = LeaseHolder(
            self.store, self.url, self.identity, pool=s.pool, lease_s=s.lease_s,
            prepare=s.prepared_statements, clock=self.clock,
            fence_after_s=self.terms.fence_after_s)
        self.keeper = LeaseKeeper(holder, self.active, interval_s=s.heartbeat_interval_s,
                                  on_lost=self._lost, concurrency=s.concurrency)
        self.claims = ClaimLoop(holder, batch=s.batch, poll_interval_s=s.poll_interval_s,
                                free_slots=lambda: s.concurrency - len(self.active),
                                start_run=self._start, wake=self._wake,
                                slot_freed=self._slot_freed)
        self.listener = (Listener(s.listen_database_url or self.url,
                                  {pool_channel(s.pool): lambda _: self._wake.set(),
                                   CANCEL_CHANNEL: self._on_cancel_notify,
                                   INBOX_CHANNEL: self._on_inbox_notify},
                                  on_connect=self._wake.set) if s.listen else None)
        self.elector = (LeaderElector(self.store, self.identity, ttl_s=s.leader_ttl_s)
                        if s.reaper else None)
        self.reaper = (Reaper(self.store, self.elector, interval_s=s.reaper_interval_s)
                       if self.elector else None)
        self.scheduler = Scheduler(self.store, self.elector) if self.elector else None
        self.webhooks = (WebhookDispatcher(self.store, self.elector,
                                           interval_s=min(1.0, s.reaper_interval_s),
                                           limits=s.webhook_limits())
                         if self.elector else None)
        self.probes = (ProbeServer(s.metrics_host, s.metrics_port, health=self._healthy,
                                   ready=self._ready) if s.metrics_port else None)
        metrics.WORKER_SLOTS.labels(s.pool).set(s.concurrency)
        metrics.WORKER_DRAINING.labels(s.pool).set(0)
        try:
            # In the workers registry until a clean shutdown: the first
            # incarnation, before anything is claimed.
            await self._first_incarnation()
            if self.probes:
                await self.probes.start()
            for service in (self.acker, self.keeper, self.listener, self.elector, self.reaper,
                            self.scheduler, self.webhooks):
                if service is not None:
                    service.start()
            if self.handle_signals:
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, self._on_signal, sig)
            self.claims.start()
            log.info("worker_started id=%s pool=%s concurrency=%s lease_s=%s heartbeat_s=%s",
                     self.identity, s.pool, s.concurrency, s.lease_s, s.heartbeat_interval_s)
            self.started.set()
            await self._done.wait()
        finally:
            await self._shutdown()
            await conn_pool.close()
        return 0

    async def _check_pool(self) -> Pool:
        """The pool's row, waiting for the database; a missing pool is an error."""
        delay = 0.2
        while True:
            try:
                pool = await self.store.get_pool(self.settings.pool)
            except RunleaseError as exc:
                log.warning("database_unreachable error=%s retry_in_s=%.1f", exc, delay)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
                continue
            if pool is None:
                raise SettingsError(f"pool {self.settings.pool!r} does not exist; create it "
                                    "first (runlease pools upsert, or an AgentRunPool)")
            if pool.lease_s and self.settings.lease_s and pool.lease_s != self.settings.lease_s:
                log.warning("lease_override pool=%s pool_lease_s=%s worker_lease_s=%s",
                            pool.name, pool.lease_s, self.settings.lease_s)
            return pool

    async def _first_incarnation(self) -> None:
        """Register the first incarnation, waiting for the database."""
        delay = 0.2
        while not await self.keeper.register():
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)

    def drain(self) -> None:
        """Begin a graceful stop (what SIGTERM does)."""
        if not self.draining:
            self.draining = True
            if self.claims is not None:
                self.claims.halt()
            self._drain_task = asyncio.create_task(self._drain(), name="drain")

    def _on_signal(self, signum: int) -> None:
        if self.draining:
            log.error("second_signal signal=%s: killing tools and exiting now", signum)
            # Each tool's guard kills its whole tree, what left the group
            # included (a group SIGKILL would kill the guard first); exiting
            # closes the lifelines too, for any guard the signal missed.
            for handle in self.active:
                for proc in list(handle.tools.live):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGUSR1)
            os._exit(1)
        log.info("drain_started signal=%s runs=%d grace_s=%s", signum, len(self.active),
                 self.settings.drain_grace_s)
        self.drain()

    async def _drain(self) -> None:
        metrics.WORKER_DRAINING.labels(self.settings.pool).set(1)
        if self.claims is not None:
            # The claim under way finishes (and hands back what it got); one
            # stuck on a dead socket is cancelled, not waited for forever.
            await self.claims.stop(self.settings.drain_grace_s + 5.0)
        await self._wait_runs(self.settings.drain_grace_s)
        if self.active:
            log.info("drain_releasing runs=%d", len(self.active))
            for handle in list(self.active):
                handle.stop(StopReason.DRAIN)
            await self._wait_runs(self.settings.tool_kill_grace_s + 10)
        log.info("drain_done")
        self._done.set()

    async def _wait_runs(self, timeout_s: float) -> None:
        waits = [h.finished.wait() for h in self.active]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout_s)

    async def _shutdown(self) -> None:
        self.draining = True
        if self.claims is not None:
            self.claims.abort()
        for handle in list(self.active):
            handle.stop(StopReason.DRAIN)
        await self._wait_runs(5)
        for task in list(self._tasks):
            task.cancel()
        for service in (self.webhooks, self.scheduler, self.reaper, self.elector,
                        self.listener, self.keeper, self.acker):
            if service is not None:
                await service.stop(2.0)
        if self.probes:
            await self.probes.stop()
        if self.claims is not None:
            await self.claims.stop(1.0)
        incarnation = self.holder.current if self.holder is not None else None
        if incarnation is not None:
            with contextlib.suppress(RunleaseError):
                await self.store.deregister_worker(incarnation.id)

    # -- claiming -----------------------------------------------------------------------

    @property
    def executing(self) -> int:
        """Attempts executing now, older attempts of reclaimed runs included."""
        return len(self.active)

    def _start(self, lease: Lease, claimed_at: float, incarnation: Incarnation) -> None:
        s = self.settings
        previous = self.held.get(lease.run_id)
        if previous is not None:
            # The run came back to this worker (reaped, then claimed again)
            # while its older attempt is still here: that attempt's lease is
            # gone, so it stops now; the new one waits for it to end.
            if previous.writes_allowed:
                metrics.child(metrics.LEASES_LOST, s.pool).inc()
                log.error("lease_lost run_id=%s epoch=%s reclaimed_as_epoch=%s", lease.run_id,
                          previous.lease.epoch, lease.epoch)
            previous.stop(StopReason.LEASE_LOST)
        handle = RunHandle(lease, self.terms, claimed_at=claimed_at, previous=previous,
                           incarnation=incarnation)
        self.held[lease.run_id] = handle
        self.active.add(handle)
        metrics.child(metrics.RUNS_CLAIMED, s.pool).inc()
        metrics.child(metrics.RUNS_IN_FLIGHT, s.pool).inc()
        log.debug("run_claimed run_id=%s tenant=%s attempt=%s epoch=%s", lease.run_id,
                 lease.run.tenant_id, lease.run.attempts, lease.epoch)
        early = self._early_cancels.pop(lease.run_id, None) if self._early_cancels else None
        if lease.run.cancel_requested_at is not None or (
                early is not None and self.clock.monotonic() - early < 30):
            handle.request_cancel()
        self.runner.launch(handle)
        self.keeper.wakeup.set()  # its next wake-up may now be this run's fence

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """A task of the worker's (cancelled at shutdown if still running)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ended(self, handle: RunHandle) -> None:
        """The attempt has really ended (an abandoned agent's task included)."""
        if handle.outcome in (None, Outcome.UNKNOWN):
            # Its ending was not written, and its incarnation lives on: the
            # keeper hands the run back rather than leave it leased by nobody.
            self.keeper.unsettled(handle)
        self.active.discard(handle)
        if self.held.get(handle.run_id) is handle:
            del self.held[handle.run_id]
        handle.ended.set()
        # Its sandbox's directory, off the loop: up to the disk limit's worth.
        # Most attempts ran no tool and made none: no thread hop for them (a
        # hop per run was a fifth of a no-op drain's worker CPU).
        if handle.tools.holds_files:
            self._spawn(asyncio.to_thread(handle.tools.close))
        # Its task is done with: a failed agent's traceback reaches the handle
        # (through the context's fence), a cycle only the collector would free.
        handle.task = None
        metrics.child(metrics.RUNS_IN_FLIGHT, self.settings.pool).dec()
        self._slot_freed.set()
        self._wake.set()

    def _ack(self, handle: RunHandle, result: Rendered) -> asyncio.Future[bool]:
        done = self.acker.submit(handle.lease, result, handle.may_write)

        # A lost lease settles the ack at once: it must not wait on a batch
        # stuck behind a dead socket.
        def settle(_: object) -> None:
            if not done.done():
                done.set_result(False)

        handle.lost.add_done_callback(settle)
        # Once answered, settle goes (the handle holds `lost`, which would
        # hold settle and the ack's future until the collector came by).
        done.add_done_callback(lambda _: handle.lost.remove_done_callback(settle))
        return done

    # -- signals from the database --------------------------------------------------------

    def _on_cancel_notify(self, payload: str) -> None:
        try:
            run_id = UUID(payload)
        except ValueError:
            return
        handle = self.held.get(run_id)
        if handle is not None:
            handle.request_cancel()
            return
        now = self.clock.monotonic()
        if len(self._early_cancels) > 1000:  # bounded: forget those long gone
            self._early_cancels = {k: t for k, t in self._early_cancels.items() if now - t < 30}
        self._early_cancels[run_id] = now

    def _on_inbox_notify(self, payload: str) -> None:
        """A message was sent to a run: wake its agent if this worker holds it
        (the agent's receive polls as well: NOTIFY is not durable)."""
        try:
            run_id = UUID(payload)
        except ValueError:
            return
        if (handle := self.held.get(run_id)) is not None:
            handle.poke_inbox()

    def _lost(self, handle: RunHandle, reason: StopReason) -> None:
        handle.stop(reason)

    # -- probes ---------------------------------------------------------------------------

    def _healthy(self) -> tuple[bool, str]:
        if not self.keeper.alive:
            return False, "lease keeper is not running"
        if self.claims is not None and self.claims.crashed and not self.draining:
            return False, "claim loop stopped"
        return True, f"ok: {len(self.held)} runs held"

    async def _ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        try:
            async with self.store.connection() as conn:
                await asyncio.wait_for(conn.execute("SELECT 1"), 2)
        except (RunleaseError, TimeoutError) as exc:
            return False, f"database unreachable: {exc}"
        return True, "ok"
