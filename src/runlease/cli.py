"""The `runlease` command."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from runlease import __version__, logs
from runlease.db.embedded import EmbeddedPostgres
from runlease.db.migrate import migrate as apply_migrations
from runlease.db.migrate import pending
from runlease.errors import RunleaseError
from runlease.settings import WorkerSettings, click_options, load

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
    server = EmbeddedPostgres(data_dir)
    click.echo(f"starting embedded PostgreSQL in {data_dir}/ ...", err=True)
    with server:
        yield server.url


@click.group()
@click.version_option(__version__, prog_name="runlease")
@click.option("--log-level", default="INFO", show_default=True, envvar="RUNLEASE_LOG_LEVEL")
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
                click.echo(f"pending: {m.version:04d}_{m.name}")
            sys.exit(1 if missing else 0)
        applied = apply_migrations(url, report=lambda line: click.echo(line, err=True))
        click.echo(f"schema is current ({len(applied)} migration(s) applied now)")


@main.command()
@database_url_option
@data_dir_option
@click.option("--runs", default=30, show_default=True, type=click.IntRange(1, 10_000))
def demo(database_url: str | None, data_dir: Path, runs: int) -> None:
    """Enqueue runs for three tenants, claim and ack them, and show what happened."""
    from runlease.demo import run_demo

    with database(database_url, data_dir) as url:
        apply_migrations(url)
        asyncio.run(run_demo(url, runs, echo=click.echo))


@main.command()
@click_options(WorkerSettings)
def worker(**options: object) -> None:
    """Claim and run a pool's runs (one per pod). Every option is also a
    RUNLEASE_* environment variable; SIGTERM drains."""
    from runlease.worker.worker import Worker

    settings = load(WorkerSettings, options)
    sys.exit(asyncio.run(Worker(settings).run()))


def run() -> None:
    try:
        main(standalone_mode=True)
    except RunleaseError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
