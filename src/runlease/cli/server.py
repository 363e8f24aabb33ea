"""The `runlease` command and its server commands: dev, migrate, worker, api,
operator (the client commands are in cli/runs.py, dead.py and pools.py)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import os
import socket
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from runlease import __version__, logs, tracing
from runlease.db.embedded import EmbeddedPostgres
from runlease.db.folder_lock import FolderBusy, FolderLock
from runlease.db.migrate import migrate as apply_migrations
from runlease.db.migrate import pending
from runlease.db.pooler import check_behind_pooler
from runlease.errors import RunleaseError, SettingsError
from runlease.settings import (
    ApiSettings,
    OperatorSettings,
    WorkerSettings,
    click_options,
    load,
)

DATA_DIR_DEFAULT = ".runlease"

database_url_option = click.option(
    "--database-url",
    envvar=["RUNLEASE_DATABASE_URL", "DATABASE_URL"],
    help="PostgreSQL URL (env RUNLEASE_DATABASE_URL or DATABASE_URL). "
    "Without one, an embedded PostgreSQL is started in --data-dir.",
)
data_dir_option = click.option(
    "--data-dir",
    envvar="RUNLEASE_DATA_DIR",
    default=DATA_DIR_DEFAULT,
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the embedded PostgreSQL keeps its data when no URL is given.",
)


@contextmanager
def database(url: str | None, data_dir: Path) -> Iterator[str]:
    """The given URL, or an embedded server in data_dir for the duration."""
    if url:
        yield url
        return
    # As `runlease dev` makes it: the superuser wants its password (db/embedded.py).
    server = EmbeddedPostgres(data_dir, password_auth=True)
    lock = FolderLock(data_dir, command="runlease migrate")
    with contextlib.suppress(FolderBusy):
        # Busy: its owner (`runlease dev`) runs the server; we use it and
        # stop nothing (EmbeddedPostgres stops only a server it started).
        lock.acquire()
    try:
        click.echo(f"starting embedded PostgreSQL in {data_dir}/ ...", err=True)
        with server:
            yield server.url
    finally:
        lock.release()


@click.group()
@click.version_option(__version__, prog_name="runlease")
@click.option("--log-level", default="INFO", show_default=True, envvar="RUNLEASE_LOG_LEVEL",
              help="DEBUG, INFO, WARNING or ERROR; DEBUG also prints the traceback of an "
                   "error that ends a command [env: RUNLEASE_LOG_LEVEL].")
@click.option("--log-json/--no-log-json", default=False, envvar="RUNLEASE_LOG_JSON",
              help="One JSON object per log line [env: RUNLEASE_LOG_JSON].")
def main(log_level: str, log_json: bool) -> None:
    """runlease: a durable run queue for long-running AI agent runs."""
    logs.configure(log_level, json_lines=log_json)


@main.command()
@database_url_option
@data_dir_option
@click.option("--check", is_flag=True, help="Apply nothing; exit 1 if migrations are pending.")
def migrate(database_url: str | None, data_dir: Path, check: bool) -> None:
    """Apply the schema migrations (safe to run from many pods at once)."""
    with database(database_url, data_dir) as url:
        if check:
            missing = pending(url)
            for m in missing:
                click.echo(f"pending: {m.file}")
            sys.exit(1 if missing else 0)
        applied = apply_migrations(url, report=lambda line: click.echo(line, err=True))
        click.echo(f"schema is current ({len(applied)} migration(s) applied now)")


@main.command()
@database_url_option
@data_dir_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the API listens on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the API (0: any free one).")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(0, 64),
              help="Worker processes (script agent, or RUNLEASE_AGENT).")
@click.option("--concurrency", default=8, show_default=True, type=click.IntRange(1, 1000),
              help="Slots per worker.")
@click.option("--token", "tokens", multiple=True, metavar="TENANT=TOKEN",
              envvar="RUNLEASE_DEV_TOKENS",
              help="Tenants' API tokens, from the environment only (RUNLEASE_DEV_TOKENS, "
                   "space-separated TENANT=TOKEN pairs): a command line is readable by "
                   "every process of the machine. Generated when none is given.")
@click.option("--admin-token", envvar="RUNLEASE_ADMIN_TOKEN",
              help="The admin API token, from the environment only (RUNLEASE_ADMIN_TOKEN); "
                   "generated when not given.")
@click.option("--demo", is_flag=True,
              help="Submit demo runs for three tenants and show them live; the stack "
                   "keeps serving (web console at /ui/) until Ctrl-C.")
@click.option("--prometheus", is_flag=True,
              help="Also start a Prometheus server (Debian's `prometheus`) with runlease's "
                   "alert rules, scraping the API and the workers; the banner shows its URL.")
def dev(database_url: str | None, data_dir: Path, host: str, port: int, workers: int,
        concurrency: int, tokens: tuple[str, ...], admin_token: str | None,
        demo: bool, prometheus: bool) -> None:
    """Everything on one machine: PostgreSQL, the API, workers, the reaper."""
    from runlease.api.auth import ADMIN, TokenRegistry, parse_token_pairs
    from runlease.dev import DevOptions, run_dev, seal_tokens

    ctx = click.get_current_context()
    for name, option in (("tokens", "--token"), ("admin_token", "--admin-token")):
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            env = "RUNLEASE_DEV_TOKENS" if name == "tokens" else "RUNLEASE_ADMIN_TOKEN"
            raise click.UsageError(
                f"{option} on the command line is readable by every process of this "
                f"machine (/proc/<pid>/cmdline), tools included: set {env} instead")
    seal_tokens()
    try:
        tenant_tokens = dict(parse_token_pairs(tokens))
        for tenant, token in tenant_tokens.items():  # checked now, not after PostgreSQL started
            TokenRegistry().add_tenant(tenant, token)
    except (ValueError, RunleaseError) as exc:
        raise click.BadParameter(str(exc), param_hint="--token") from None
    if admin_token is not None:
        try:
            TokenRegistry().add(admin_token, ADMIN)
        except RunleaseError as exc:
            raise click.BadParameter(str(exc), param_hint="--admin-token") from None
    options = DevOptions(data_dir=data_dir, database_url=database_url, host=host, port=port,
                         workers=workers, concurrency=concurrency, tenant_tokens=tenant_tokens,
                         admin_token=admin_token, demo=demo, prometheus=prometheus)
    # The API runs in this process; the workers, `runlease worker` processes,
    # set tracing up themselves from the same OTEL_* variables.
    tracing.setup("runlease-api")
    try:
        code = asyncio.run(run_dev(options, click.echo))
    finally:
        tracing.shutdown()
    sys.exit(code)


@main.command()
@click_options(WorkerSettings)
def worker(**options: object) -> None:
    """Claim and run a pool's runs (one per pod). Every option is also a
    RUNLEASE_* environment variable; SIGTERM drains."""
    from runlease.worker.worker import Worker

    warn_url_on_command_line(options)
    settings = load(WorkerSettings, options)  # imports the agent, too
    # What is loaded now (modules, the agent's imports) lives as long as the
    # process: kept out of the collector's full passes, which a busy worker's
    # many short-lived objects per run would otherwise trigger over and over.
    gc.collect()
    gc.freeze()
    # A draining worker allocates its runs' objects a batch at a time (a
    # claim of 100 runs: ~3,000 objects alive together): at the default
    # threshold (700) the young generation is collected several times per
    # batch and every live run is traversed and promoted each time. A higher
    # one collects when most of them are freed already (refcounting frees a
    # run's objects: they hold no cycle, see worker/runner.py).
    gc.set_threshold(10_000, 10, 10)
    tracing.setup("runlease-worker")  # when the OTEL_* variables ask (docs/operations.md)
    try:
        code = asyncio.run(Worker(settings).run())
    finally:
        tracing.shutdown()
    sys.exit(code)


@main.command()
@click_options(ApiSettings)
def api(**options: object) -> None:
    """Serve the HTTP API. Every option is also a RUNLEASE_* environment variable."""
    from runlease.api.app import create_app
    from runlease.api.server import ApiServer, bind_socket, run_forever

    warn_url_on_command_line(options)
    settings = load(ApiSettings, options)
    if settings.database_url:
        # As a worker does: behind a transaction pooler, prepared statements
        # would fail at random as 500s; refuse in one line instead.
        asyncio.run(check_behind_pooler(settings.database_url,
                                        prepared=settings.prepared_statements, listen=False))
    tracing.setup("runlease-api")  # when the OTEL_* variables ask (docs/operations.md)
    app = create_app(settings)
    # Bound before anything starts: a busy port is one line, not a traceback.
    server = ApiServer(app, settings.host, settings.port,
                       sock=bind_socket(settings.host, settings.port))
    try:
        run_forever(server)
    finally:
        tracing.shutdown()


@main.command()
@click_options(OperatorSettings)
def operator(**options: object) -> None:
    """Run the Kubernetes operator: AgentRunPools -> worker Deployments; hosts the
    reaper. Every option is also a RUNLEASE_* environment variable."""
    from runlease.operator.main import run as run_operator

    settings = load(OperatorSettings, options)
    check_port_free(settings.metrics_host, settings.metrics_port)
    check_cluster()
    run_operator(settings)


def warn_url_on_command_line(options: dict[str, object]) -> None:
    """Options come from the command line (the environment is read by load())."""
    if options.get("database_url") or options.get("listen_database_url"):
        logging.getLogger("runlease.cli").warning(
            "database_url_on_command_line: every process of this machine can read it in "
            "/proc/<pid>/cmdline; give it as RUNLEASE_DATABASE_URL or --database-url-file")


def check_port_free(host: str, port: int) -> None:
    """The operator's probe server starts inside kopf, whose start-up would
    bury a busy port under a page of tracebacks: say it in one line first."""
    if not port:
        return
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            taken = " is already in use" if exc.errno == errno.EADDRINUSE else f": {exc}"
            raise SettingsError(f"--metrics-port (RUNLEASE_METRICS_PORT): {host}:{port}{taken}; "
                                "pick another, or 0 to turn /metrics off") from None


def check_cluster() -> None:
    """Fail at once, in one line, where kopf would fail its login after a
    page of tracebacks: no service account (not in a pod) and no kubeconfig."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return
    configs = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if any(os.path.exists(p) for p in configs or [os.path.expanduser("~/.kube/config")]):
        return
    looked = "KUBECONFIG=" + os.pathsep.join(configs) if configs else "~/.kube/config"
    raise RunleaseError(f"no Kubernetes cluster: not in a pod, and no kubeconfig ({looked} "
                        "does not exist); point KUBECONFIG at a cluster, or try runlease "
                        "without one: `runlease dev`")


def run() -> None:
    """The entry point: an error that ends the command is one line on stderr
    and exit code 1; the traceback only with --log-level DEBUG."""
    try:
        main(standalone_mode=True)
    except Exception as exc:
        if isinstance(exc, RunleaseError):
            click.echo(f"error: {exc}", err=True)
        else:
            click.echo(f"error: {type(exc).__name__}: {exc} (--log-level DEBUG shows where)",
                       err=True)
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            traceback.print_exc()
        sys.exit(1)
