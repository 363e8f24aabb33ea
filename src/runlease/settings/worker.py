"""`runlease worker`'s settings."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from runlease.core.bounds import check_pool
from runlease.errors import SettingsError, ValidationError
from runlease.settings.mechanism import describe, import_object, setting
from runlease.settings.reaper import ReaperSettings


def load_agent(spec: str, app_dir: str = ".") -> Any:
    """The --agent callable, imported with app_dir first on the path (as
    uvicorn's --app-dir: `runlease worker --agent mymodule:agent` works from
    the module's folder) and refused at start unless it is async."""
    where = describe("agent")
    if app_dir and (path := os.path.abspath(app_dir)) not in sys.path:
        sys.path.insert(0, path)
    try:
        agent = import_object(spec)
    except SettingsError as exc:
        raise SettingsError(f"{where}: {exc} (searched {app_dir or 'nothing'!s} from "
                            f"--app-dir, then the installed packages)") from None
    if not (inspect.iscoroutinefunction(agent)
            or inspect.iscoroutinefunction(getattr(agent, "__call__", None))):  # noqa: B004
        # An agent of a supported library (OpenAI Agents SDK, PydanticAI,
        # LangGraph), adapted: runlease.integrations.
        from runlease.integrations import adapt
        adapted = adapt(agent, spec)
        if adapted is not None:
            return adapted
        raise SettingsError(f"{where}: {spec} is not an async function; an agent is "
                            "`async def agent(ctx): ...` (the worker awaits it), or an "
                            "agent of the OpenAI Agents SDK, PydanticAI or LangGraph")
    return agent


@dataclass(frozen=True, kw_only=True)
class WorkerSettings(ReaperSettings):
    """`runlease worker`: one per pod."""

    agent: str = setting(help="The agent to run, as module:callable (an async function "
                              "taking a RunContext).")
    app_dir: str = setting(".", "Folder put first on the import path before --agent is "
                                "imported (as uvicorn's --app-dir); '' adds none.")
    database_url: str | None = setting(
        None, "PostgreSQL URL for claims, heartbeats and agent writes.", env=("DATABASE_URL",))
    database_url_file: str | None = setting(
        None, "A file holding the PostgreSQL URL (a mounted Secret): unlike --database-url, "
              "on no command line, which every process of the machine can read.")
    listen_database_url: str | None = setting(
        None, "Separate URL for the LISTEN session (a direct or session-mode PgBouncer "
              "URL when database_url goes through PgBouncer in transaction mode); "
              "defaults to database_url.")
    listen: bool = setting(True, "Wake on NOTIFY; with --no-listen the worker only polls.")
    prepared_statements: bool = setting(
        True, "Server-side prepared statements on pooled connections; turn off behind "
              "PgBouncer in transaction mode.")
    pool: str = setting("default", "The pool whose runs this worker claims.")
    concurrency: int = setting(10, "Runs executed at once (slots).", minimum=1, maximum=10_000)
    claim_batch: int | None = setting(
        None, "Most runs claimed in one statement; defaults to half the concurrency (so "
              "the next claim goes out while the previous one's runs finish).", minimum=1,
        maximum=1000)
    lease_s: int = setting(
        0, "Lease length: a run whose worker stops renewing is reaped this long after the "
           "last renewal. 0 (the default): the pool's lease_s, read at start (the pool row "
           "is the one source; set it with the AgentRunPool, `runlease pools` or the API); "
           "any other value overrides the pool for this worker (tests, experiments).",
        minimum=0, maximum=3600)
    heartbeat_interval_s: float = setting(
        0.0, "Seconds between lease renewals; must be below lease_s / 2. 0 (the default): "
             "a third of the lease, at most 15 s.", minimum=0)
    fence_margin_s: float | None = setting(
        None, "Safety margin of self-fencing: a run is stopped when lease_s minus this "
              "has passed since its last renewal; defaults to min(5, lease_s / 5).",
        minimum=0.01)
    poll_interval_s: float = setting(
        2.0, "Seconds between claims when nothing is notified (jittered +-25%).",
        minimum=0.01, maximum=3600)
    cancel_grace_s: float = setting(
        10.0, "After a cancel request, how long the agent may take to stop before its "
              "task is cancelled.", minimum=0)
    tool_kill_grace_s: float = setting(
        5.0, "After SIGTERM to a tool's process group, how long before SIGKILL.", minimum=0)
    tool_sandbox: bool = setting(
        True, "Run every tool in a bubblewrap sandbox of its own (new user, PID, IPC and "
              "mount namespaces, the run's own directory, limits; docs/security.md). "
              "Without it, only --tool-tenant's runs may run tools, unless "
              "--unsandboxed-pool names this worker's pool.")
    tool_network: bool = setting(True, "Tools may use the network; with --no-tool-network "
                                       "they get a network namespace of their own, empty.")
    tool_max_processes: int = setting(256, "Processes and threads of one tool call.",
                                      minimum=8, maximum=1_000_000)
    tool_memory_mib: int = setting(1024, "Address space of each tool process, MiB.",
                                   minimum=64, maximum=1_048_576)
    tool_cpu_s: int = setting(600, "CPU seconds of each tool process.", minimum=1,
                              maximum=1_000_000)
    tool_file_size_mib: int = setting(256, "Largest file a tool may write, MiB.", minimum=1,
                                      maximum=1_048_576)
    tool_disk_mib: int = setting(
        512, "Disk of a run's tools, MiB: the size of each tool's /tmp (a tmpfs, so it "
             "counts as the pod's memory) and of the run's own directory.", minimum=1,
        maximum=1_048_576)
    tool_hide_paths: tuple[str, ...] = setting(
        (), "More directories tools must not see (each hidden behind an empty tmpfs), "
            "besides /tmp, /run, /home, /root, the worker's HOME and the runs' directories.")
    tool_runs_dir: str = setting(
        "", "Where each run's directory is made (hidden from tools); '' is "
            "$TMPDIR/runlease-runs-<uid>.")
    tool_uid: int = setting(65534, "A worker running as root starts its tools' sandboxes "
                                   "as this uid (root's files stay closed to them).",
                            minimum=1, maximum=2**31 - 2)
    tool_tenant: str | None = setting(
        None, "With --no-tool-sandbox: the one tenant whose runs may run tools on this "
              "worker (other tenants' tool calls fail).")
    unsandboxed_pool: str | None = setting(
        None, "With --no-tool-sandbox: this worker's pool name, written out, to let every "
              "tenant's tools run unsandboxed side by side (an admin's opt-in; they can "
              "then read and signal each other).")
    trace_tool_arguments: bool = setting(
        False, "With tracing on (docs/operations.md), each tool's span also names its "
               "arguments, redacted and at most 1,000 characters (the pool's opt-in: they "
               "are the tenant's data); never its output.")
    drain_grace_s: float = setting(
        25.0, "On SIGTERM, how long running runs may finish before they are cancelled and "
              "released; keep it below the pod's terminationGracePeriodSeconds.", minimum=0)
    metrics_port: int = setting(9464, "Port of /metrics, /healthz and /readyz; 0 turns it off.",
                                minimum=0, maximum=65535)
    metrics_host: str = setting("0.0.0.0", "Address /metrics listens on.")
    log_json: bool = setting(False, "Log one JSON object per line.")
    redact_patterns: tuple[str, ...] = setting(
        (), "Extra regular expressions whose matches are redacted from everything stored "
            "(results, error messages, events, step results) and from log lines "
            "(comma-separated in the environment).")

    def check(self) -> None:
        if self.lease_s:
            self.check_lease()
        self.check_leader_ttl()
        for pattern in self.redact_patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SettingsError(
                    f"{describe('redact_patterns')}: {pattern!r}: {exc}") from None
        try:
            check_pool(self.pool)
        except ValidationError as exc:
            raise SettingsError(f"{describe('pool')}: {exc.message}") from None
        self.check_tool_sandbox()
        load_agent(self.agent, self.app_dir)

    def check_tool_sandbox(self) -> None:
        """No sandbox: one tenant's tools only, unless the pool is named."""
        if self.tool_sandbox or self.tool_tenant or self.unsandboxed_pool == self.pool:
            return
        raise SettingsError(
            f"{describe('tool_sandbox')} is off: tools of different tenants would share "
            f"the worker (their files, processes and environments); set "
            f"{describe('tool_tenant')} to the one tenant this pool serves, or "
            f"{describe('unsandboxed_pool')} to {self.pool!r} to allow it anyway")

    def with_pool_lease(self, pool_lease_s: int) -> WorkerSettings:
        """These settings with the lease resolved: lease_s 0 takes the pool's,
        heartbeat_interval_s 0 a third of the lease (at most 15 s); checked."""
        lease_s = self.lease_s or pool_lease_s
        heartbeat = self.heartbeat_interval_s or min(15.0, lease_s / 3)
        resolved = dataclasses.replace(self, lease_s=lease_s, heartbeat_interval_s=heartbeat)
        resolved.check_lease()
        return resolved

    def check_lease(self) -> None:
        heartbeat = self.heartbeat_interval_s or min(15.0, self.lease_s / 3)
        if heartbeat >= self.lease_s / 2:
            raise SettingsError(
                f"{describe('heartbeat_interval_s')} must be below half of lease_s "
                f"({self.lease_s} s): got {heartbeat}; a lease must survive "
                "a missed renewal"
            )
        if self.margin_s >= self.lease_s - heartbeat:
            raise SettingsError(
                f"{describe('fence_margin_s')} must be below lease_s - heartbeat_interval_s "
                f"({self.lease_s - heartbeat:g} s): got {self.margin_s}"
            )

    @property
    def margin_s(self) -> float:
        return self.fence_margin_s if self.fence_margin_s is not None else min(5.0,
                                                                                self.lease_s / 5)

    @property
    def batch(self) -> int:
        # Half by default: with every slot claimed in one statement, a worker
        # of short runs alternates claim, runs, ack, claim; with half, a claim
        # is under way while the other half's runs finish and are acked
        # (docs/benchmarks.md: +13-45 % on a 20,000-run drain, 2 processes).
        return min(self.claim_batch or max(1, (self.concurrency + 1) // 2), self.concurrency)
