"""Drain benchmark of two peer PostgreSQL job queues: PgQueuer and Procrastinate.

Each ``bench_*`` function:

1. creates (if missing) a dedicated database for that peer on the same server
   as ``database_url`` (``bench_pgqueuer`` / ``bench_procrastinate``) and drops
   and recreates its ``public`` schema, so nothing collides with runlease's own
   tables nor with the other peer (LISTEN/NOTIFY channels are per database too);
2. installs the library's schema through its own API;
3. enqueues ``jobs`` no-op jobs in one bulk call of the library (timed on its
   own: ``enqueue_s``);
4. starts the consumers the library's idiomatic way, each worker in its own OS
   process (this very file re-executed with a hidden ``--_worker`` flag);
5. times, from the moment the already connected workers are told to go until
   the library's own tables say every job finished, by polling from the parent.

The libraries are imported lazily, inside functions: they are the optional
``bench`` extra and never a runtime dependency of runlease. The worker children
only call the libraries' public APIs.

Run ``python bench/peers.py --database-url postgresql://... --jobs 20000``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

# A run must never hang: the consumer phase (spawn -> every job finished) is
# bounded by this, after which every child is killed and TimeoutError raised.
DEFAULT_TIMEOUT_S = 120.0
# Poll period of the completion check: 10 ms keeps the timing error small
# (<1 % of a 2.5 s drain); the EXISTS poll costs the server well under 1 ms.
POLL_INTERVAL_S = 0.01
# How long children get to shut down gracefully, once told to, before SIGKILL.
STOP_GRACE_S = 10.0

# The URL goes to the children through the environment rather than argv, so a
# password in it never shows up in `ps`.
_URL_ENV = "RUNLEASE_PEERS_DATABASE_URL"
_READY = b"ready\n"
_GO = b"go\n"

PGQUEUER_DB = "bench_pgqueuer"
PROCRASTINATE_DB = "bench_procrastinate"
# One entrypoint / task name, spelled the same in parent and children. An
# explicit Procrastinate task name matters: its default is the function's
# dotted path, which differs between `__main__` and an imported `bench.peers`.
_NOOP = "runlease_bench_noop"


# --------------------------------------------------------------------------
# Database preparation and polling (parent side, sync psycopg)
# --------------------------------------------------------------------------


def _with_dbname(database_url: str, dbname: str) -> str:
    """The same server/user/options as ``database_url``, another database."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(database_url)
    params["dbname"] = dbname
    # Never wait forever for a server that is not there.
    params.setdefault("connect_timeout", "10")
    return make_conninfo("", **params)


def _connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def _fresh_database(database_url: str, dbname: str) -> str:
    """Create ``dbname`` if missing, empty its public schema; return its URL."""
    from psycopg import sql

    with _connect(_with_dbname(database_url, "postgres")) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if exists is None:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))

    url = _with_dbname(database_url, dbname)
    with _connect(url) as conn:
        # A leftover session from a killed run must not make DROP wait forever.
        conn.execute("SET lock_timeout = '10s'")
        conn.execute("DROP SCHEMA IF EXISTS public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return url


def _scalar(conn: psycopg.Connection[tuple[Any, ...]], query: str) -> int:
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _server_version(url: str) -> str:
    with _connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"


def _analyze(url: str) -> None:
    # 20k rows were just bulk-inserted into empty tables: give the planner
    # statistics now (as autovacuum eventually would) instead of letting an
    # autoanalyze fire in the middle of one peer's timed window but not the
    # other's. Done for both peers, outside the timing.
    with _connect(url) as conn:
        conn.execute("ANALYZE")


# --------------------------------------------------------------------------
# Child process management (parent side)
# --------------------------------------------------------------------------


class _Children:
    """Worker subprocesses with a ready/go handshake and guaranteed cleanup.

    Each child connects and registers its work, prints ``ready``, then blocks
    until it reads ``go`` on stdin. The clock therefore measures queue work,
    not interpreter start-up, imports or connection set-up (reported apart as
    ``startup_s``). Children get their own session so a kill reaches anything
    they may have spawned.
    """

    def __init__(self, argvs: list[list[str]], url: str) -> None:
        self._argvs = argvs
        self._url = url
        self.procs: list[subprocess.Popen[bytes]] = []
        self._stderr: list[IO[bytes]] = []
        # CPU seconds each child reports it spent after `go` (None if it died).
        self.cpu_s: list[float | None] = []

    def __enter__(self) -> _Children:
        env = dict(os.environ)
        env[_URL_ENV] = self._url
        try:
            for argv in self._argvs:
                err = tempfile.TemporaryFile()
                self._stderr.append(err)
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        env=env,
                        start_new_session=True,
                    )
                )
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def wait_ready(self, deadline: float) -> None:
        pending: dict[int, subprocess.Popen[bytes]] = {}
        buffers: dict[int, bytes] = {}
        with selectors.DefaultSelector() as sel:
            for proc in self.procs:
                assert proc.stdout is not None
                fd = proc.stdout.fileno()
                pending[fd] = proc
                buffers[fd] = b""
                sel.register(fd, selectors.EVENT_READ)
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{len(pending)} worker process(es) not ready in time\n"
                        + self.stderr_tail()
                    )
                for key, _ in sel.select(timeout=min(left, 0.5)):
                    fd = int(key.fd)
                    chunk = os.read(fd, 64)
                    if not chunk:
                        raise RuntimeError(
                            "a worker process exited before it was ready\n" + self.stderr_tail()
                        )
                    buffers[fd] += chunk
                    if buffers[fd].endswith(_READY):
                        sel.unregister(fd)
                        del pending[fd]
                self.check_alive()

    def go(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(_GO)
            proc.stdin.flush()

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"worker process {proc.pid} exited early with code {proc.returncode}\n"
                    + self.stderr_tail()
                )

    def stderr_tail(self, limit: int = 4000) -> str:
        out: list[str] = []
        for proc, err in zip(self.procs, self._stderr, strict=True):
            with contextlib.suppress(OSError, ValueError):
                err.flush()
                err.seek(0)
                text = err.read().decode(errors="replace").strip()
                if text:
                    out.append(f"--- worker pid {proc.pid} stderr ---\n{text[-limit:]}")
        return "\n".join(out)

    def stop(self) -> None:
        """Close stdin, give a grace period, then SIGKILL.

        A child seeing EOF on stdin sends itself one SIGTERM, i.e. the
        library's own graceful shutdown (before ``go`` it just exits). No
        second SIGTERM from here: Procrastinate uninstalls its handler after
        the first, so a second one would kill the worker mid-shutdown.
        """
        for proc in self.procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            # Whatever is left of the session (the child or anything it
            # started) dies now.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if proc.stdout is not None:
                self.cpu_s.append(_read_cpu_report(proc.stdout))
                proc.stdout.close()
        for err in self._stderr:
            err.close()
        self._stderr.clear()


def _read_cpu_report(stdout: IO[bytes]) -> float | None:
    """The ``cpu <seconds>`` line a child prints on a clean exit, if any."""
    fd = stdout.fileno()
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(fd, 4096):
            data += chunk
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("cpu "):
            return float(line.split()[1])
    return None


def _worker_argv(peer: str, **options: int) -> list[str]:
    argv = [sys.executable, os.path.abspath(__file__), "--_worker", peer]
    for name, value in options.items():
        argv += [f"--_{name}", str(value)]
    return argv


def _drain(
    *,
    url: str,
    argvs: list[list[str]],
    unfinished: str,
    jobs: int,
    timeout_s: float,
    peer: str,
) -> tuple[float, float, float, float | None]:
    """Start the children, release them, poll until no job is unfinished.

    ``unfinished`` is a ``FROM ... [WHERE ...]`` fragment naming the jobs not
    finished yet. Returns ``(startup_s, seconds, loadavg_1m_before,
    worker_cpu_s)``; the last is None unless every child reported its CPU.
    """
    # EXISTS stops at the first unfinished row, so the poll stays cheaper than
    # a count for the server that is being measured; count only for errors.
    pending_sql = f"SELECT EXISTS (SELECT 1 FROM {unfinished})::int"
    # The host's 1-minute load just before the start: a noisy neighbour (other
    # processes on a 2-core box) shows up here, so runs can be judged.
    load_before = os.getloadavg()[0]
    spawned = time.monotonic()
    deadline = spawned + timeout_s
    with _connect(url) as poll, _Children(argvs, url) as children:
        children.wait_ready(deadline)
        started = time.perf_counter()
        startup_s = time.monotonic() - spawned
        children.go()
        while _scalar(poll, pending_sql):
            children.check_alive()
            if time.monotonic() > deadline:
                remaining = _scalar(poll, f"SELECT count(*) FROM {unfinished}")
                raise TimeoutError(
                    f"{peer}: {jobs - remaining}/{jobs} jobs finished after "
                    f"{timeout_s:.0f} s; giving up (children killed)\n" + children.stderr_tail()
                )
            time.sleep(POLL_INTERVAL_S)
        seconds = time.perf_counter() - started
    cpu = children.cpu_s
    worker_cpu_s = None if None in cpu else sum(c for c in cpu if c is not None)
    return startup_s, seconds, load_before, worker_cpu_s


def _split(total: int, parts: int) -> list[int]:
    """``total`` consumers spread as evenly as possible over ``parts`` processes."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _result(
    peer: str,
    jobs: int,
    seconds: float,
    enqueue_s: float,
    startup_s: float,
    load_before: float,
    worker_cpu_s: float | None,
    version: str,
    settings: dict[str, Any],
) -> dict[str, Any]:
    return {
        "peer": peer,
        "jobs": jobs,
        "seconds": round(seconds, 4),
        "jobs_per_s": round(jobs / seconds, 1),
        "enqueue_s": round(enqueue_s, 4),
        "startup_s": round(startup_s, 4),
        "host_loadavg_1m_before": round(load_before, 2),
        # CPU the worker processes burnt from `go` to their exit (user+sys,
        # all threads): less sensitive to a busy host than wall time.
        "worker_cpu_s": None if worker_cpu_s is None else round(worker_cpu_s, 3),
        "settings": settings,
        "version": version,
    }


# --------------------------------------------------------------------------
# PgQueuer
# --------------------------------------------------------------------------


def bench_pgqueuer(
    database_url: str,
    jobs: int = 20_000,
    consumers: int = 5,
    batch: int = 10,
    *,
    processes: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    analyze: bool = True,
) -> dict[str, Any]:
    """Drain ``jobs`` no-op PgQueuer jobs with ``consumers`` PgQueuer instances.

    Each consumer is a ``PgQueuer`` over its own psycopg ``AsyncConnection``
    (the psycopg driver), run by ``pgqueuer.run`` - what ``pgq run`` does,
    including uvloop when installed - with ``batch_size=batch``. By default
    every consumer gets its own OS process (``processes=consumers``);
    ``processes=1`` puts all of them on one event loop, as PgQueuer's own
    ``tools/benchmark.py`` does. ``analyze=False``: the burst case, the
    queue drained on the statistics of its freshly installed (empty) tables.
    """
    import pgqueuer

    processes = consumers if processes is None else processes
    if not 1 <= processes <= consumers:
        raise ValueError("processes must be between 1 and consumers")
    url = _fresh_database(database_url, PGQUEUER_DB)

    async def install_and_enqueue() -> tuple[float, str, str]:
        import psycopg

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            queries = pgqueuer.Queries.from_psycopg_connection(conn)
            await queries.install()
            started = time.perf_counter()
            # One bulk INSERT ... UNNEST, PgQueuer's batch enqueue.
            await queries.enqueue([_NOOP] * jobs, [None] * jobs, [0] * jobs)
            enqueue_s = time.perf_counter() - started
            # Table names as this PgQueuer build (and PGQUEUER_* env) spells them.
            names = queries.qbe.settings
            return enqueue_s, names.queue_table, names.queue_table_log

    enqueue_s, queue_table, log_table = asyncio.run(install_and_enqueue())
    if analyze:
        _analyze(url)

    argvs = [
        _worker_argv("pgqueuer", consumers=n, batch=batch) for n in _split(consumers, processes)
    ]
    # Finished jobs are deleted from the queue table (and logged); failed
    # ones too with the default on_failure="delete", checked below.
    startup_s, seconds, load_before, worker_cpu_s = _drain(
        url=url,
        argvs=argvs,
        unfinished=queue_table,
        jobs=jobs,
        timeout_s=timeout_s,
        peer="pgqueuer",
    )
    with _connect(url) as conn:
        ok = _scalar(conn, f"SELECT count(*) FROM {log_table} WHERE status = 'successful'")
    if ok != jobs:
        raise RuntimeError(f"pgqueuer: only {ok}/{jobs} jobs logged as successful")

    return _result(
        "pgqueuer",
        jobs,
        seconds,
        enqueue_s,
        startup_s,
        load_before,
        worker_cpu_s,
        # pgqueuer sets __version__ without re-exporting it to type checkers.
        str(getattr(pgqueuer, "__version__", "?")),
        {
            "consumers": consumers,
            "processes": processes,
            "batch_size": batch,
            "driver": "psycopg AsyncConnection (PsycopgDriver), one per consumer",
            "runner": "pgqueuer.run(factory) (= `pgq run`), mode=continuous",
            "event_loop": _pgqueuer_loop_name(),
            "entrypoint": "async no-op",
            "durability": "library default (durable)",
            "server": _server_version(url),
            "python": platform.python_version(),
        },
    )


def _pgqueuer_loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def _pgqueuer_worker(consumers: int, batch: int) -> None:
    """Child: ``consumers`` PgQueuer instances in this process, one connection each."""
    import pgqueuer
    import psycopg

    url = os.environ[_URL_ENV]
    gate = _Gate(consumers)

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[pgqueuer.PgQueuer]:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            pgq = pgqueuer.PgQueuer.from_psycopg_connection(conn)

            # accepts_context=False: no signature sniffing of a string
            # annotation that names a function-local import.
            @pgq.entrypoint(_NOOP, accepts_context=False)
            async def noop(job: pgqueuer.Job) -> None:
                return None

            await gate.arrive()
            yield pgq

    async def main() -> None:
        if consumers == 1:
            # Exactly `pgq run`: the supervisor installs SIGTERM/SIGINT handlers.
            await pgqueuer.run(factory, batch_size=batch)
            return
        # Several instances share one loop; pgqueuer.run leaves signal
        # handling to the caller when given a shutdown event.
        shutdown = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, shutdown.set)
        await asyncio.gather(
            *(pgqueuer.run(factory, batch_size=batch, shutdown=shutdown) for _ in range(consumers))
        )

    _run_loop(main, prefer_uvloop=True)


# --------------------------------------------------------------------------
# Procrastinate
# --------------------------------------------------------------------------


def _procrastinate_app(url: str, pool_max_size: int) -> tuple[Any, Any]:
    import procrastinate

    pool_args: dict[str, Any] = {"conninfo": url}
    if pool_max_size > 0:
        # psycopg_pool's default is a fixed pool of 4 connections.
        pool_args.update(min_size=min(4, pool_max_size), max_size=pool_max_size)
    # Procrastinate warns when an App is built in `__main__` (default task
    # names would then differ between processes); ours is explicit, so the
    # warning is noise when this file runs as a script.
    blueprints_log = logging.getLogger("procrastinate.blueprints")
    level = blueprints_log.level
    blueprints_log.setLevel(logging.ERROR)
    try:
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(**pool_args))
    finally:
        blueprints_log.setLevel(level)

    @app.task(name=_NOOP)
    async def noop() -> None:
        return None

    return app, noop


def bench_procrastinate(
    database_url: str,
    jobs: int = 20_000,
    concurrency: int = 10,
    *,
    processes: int = 1,
    pool_max_size: int = 0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Drain ``jobs`` no-op Procrastinate jobs with a worker of ``concurrency``.

    The worker is ``App.run_worker_async(concurrency=...)`` on an opened app
    with a ``PsycopgConnector`` - what ``procrastinate worker --concurrency``
    does - in a subprocess (``processes`` of them, default 1), plain asyncio
    loop like its CLI, other worker options left at their defaults
    (LISTEN/NOTIFY on, jobs kept as ``succeeded``). ``pool_max_size=0`` keeps
    psycopg_pool's default pool (4 connections).
    """
    import procrastinate

    if processes < 1:
        raise ValueError("processes must be >= 1")
    url = _fresh_database(database_url, PROCRASTINATE_DB)

    async def install_and_enqueue() -> float:
        app, noop = _procrastinate_app(url, pool_max_size)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            started = time.perf_counter()
            # One bulk INSERT, Procrastinate's batch defer.
            await noop.batch_defer_async(*({} for _ in range(jobs)))
            return time.perf_counter() - started

    enqueue_s = asyncio.run(install_and_enqueue())
    _analyze(url)

    argvs = [
        _worker_argv("procrastinate", concurrency=concurrency, pool_max_size=pool_max_size)
        for _ in range(processes)
    ]
    startup_s, seconds, load_before, worker_cpu_s = _drain(
        url=url,
        argvs=argvs,
        unfinished="procrastinate_jobs WHERE status IN ('todo', 'doing')",
        jobs=jobs,
        timeout_s=timeout_s,
        peer="procrastinate",
    )
    with _connect(url) as conn:
        ok = _scalar(conn, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
    if ok != jobs:
        raise RuntimeError(f"procrastinate: only {ok}/{jobs} jobs succeeded")

    return _result(
        "procrastinate",
        jobs,
        seconds,
        enqueue_s,
        startup_s,
        load_before,
        worker_cpu_s,
        procrastinate.__version__,
        {
            "concurrency": concurrency,
            "processes": processes,
            "connector": "PsycopgConnector (psycopg_pool.AsyncConnectionPool)",
            "pool": f"max_size={pool_max_size}" if pool_max_size else "default (4 connections)",
            "runner": "App.run_worker_async (= `procrastinate worker`)",
            "listen_notify": True,
            "delete_jobs": "never (default)",
            "event_loop": "asyncio",
            "task": "async no-op",
            "server": _server_version(url),
            "python": platform.python_version(),
        },
    )


def _procrastinate_worker(concurrency: int, pool_max_size: int) -> None:
    """Child: one Procrastinate worker."""
    url = os.environ[_URL_ENV]
    app, _ = _procrastinate_app(url, pool_max_size)

    async def main() -> None:
        async with app.open_async():
            await _Gate(1).arrive()
            # Default install_signal_handlers=True: SIGTERM stops it gracefully.
            await app.run_worker_async(concurrency=concurrency)

    _run_loop(main, prefer_uvloop=False)


# --------------------------------------------------------------------------
# Child plumbing
# --------------------------------------------------------------------------


# process_time() of this child when it was released; see _run_loop.
_CPU_AT_GO: list[float] = []


class _Gate:
    """Ready/go handshake inside a child: once ``expected`` consumers have
    arrived (connected), say ``ready`` on stdout and wait for ``go`` on stdin.
    """

    def __init__(self, expected: int) -> None:
        self._expected = expected
        self._arrived = 0
        self._go = asyncio.Event()

    async def arrive(self) -> None:
        self._arrived += 1
        if self._arrived == self._expected:
            sys.stdout.buffer.write(_READY)
            sys.stdout.buffer.flush()
            line = await asyncio.to_thread(sys.stdin.buffer.readline)
            if line != _GO:
                # Parent went away or aborted before the start.
                raise SystemExit(1)
            _CPU_AT_GO.append(time.process_time())
            # EOF on stdin - the parent's stop, or the parent died - becomes
            # one SIGTERM: the library's own graceful shutdown, no orphans.
            threading.Thread(target=_terminate_on_eof, daemon=True).start()
            self._go.set()
        await self._go.wait()


def _terminate_on_eof() -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stdin.buffer.read()
    os.kill(os.getpid(), signal.SIGTERM)


def _run_loop(main: Callable[[], Any], *, prefer_uvloop: bool) -> None:
    # Both libraries log per job at INFO (Procrastinate) or DEBUG (PgQueuer);
    # keep only warnings so neither pays for terminal output in the timing.
    logging.basicConfig(level=logging.WARNING)
    if prefer_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.run(main())
            _report_cpu()
            return
    asyncio.run(main())
    _report_cpu()


def _report_cpu() -> None:
    if _CPU_AT_GO:
        sys.stdout.write(f"cpu {time.process_time() - _CPU_AT_GO[0]:.6f}\n")
        sys.stdout.flush()


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_keyboard_interrupt() -> Iterator[None]:
    try:
        yield
    except KeyboardInterrupt:
        sys.exit(130)


def _table(results: list[dict[str, Any]]) -> str:
    header = (
        "peer",
        "version",
        "jobs",
        "seconds",
        "jobs/s",
        "enqueue_s",
        "startup_s",
        "load1",
        "settings",
    )
    rows = [
        (
            r["peer"],
            r["version"],
            str(r["jobs"]),
            f"{r['seconds']:.3f}",
            f"{r['jobs_per_s']:.0f}",
            f"{r['enqueue_s']:.3f}",
            f"{r['startup_s']:.2f}",
            f"{r['host_loadavg_1m_before']:.2f}",
            ", ".join(
                f"{k}={v}"
                for k, v in r["settings"].items()
                if k in ("consumers", "processes", "batch_size", "concurrency", "pool")
            ),
        )
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=1, help="runs per peer")
    parser.add_argument(
        "--peer", choices=("pgqueuer", "procrastinate"), action="append", help="default: both"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per consumer phase"
    )
    # Hidden: this file re-executed as a worker child.
    parser.add_argument("--_worker", choices=("pgqueuer", "procrastinate"), help=argparse.SUPPRESS)
    parser.add_argument("--_consumers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--_batch", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--_concurrency", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--_pool_max_size", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args._worker == "pgqueuer":
        _pgqueuer_worker(args._consumers, args._batch)
        return 0
    if args._worker == "procrastinate":
        _procrastinate_worker(args._concurrency, args._pool_max_size)
        return 0

    if not args.database_url:
        parser.error("--database-url (or DATABASE_URL) is required")
    benches: dict[str, Callable[..., dict[str, Any]]] = {
        "pgqueuer": bench_pgqueuer,
        "procrastinate": bench_procrastinate,
    }
    results: list[dict[str, Any]] = []
    for _ in range(args.repeat):
        for peer in args.peer or list(benches):
            results.append(benches[peer](args.database_url, jobs=args.jobs, timeout_s=args.timeout))
            if not args.json:
                print(f"{peer}: {results[-1]['jobs_per_s']:.0f} jobs/s", file=sys.stderr)
    print(json.dumps(results, indent=2) if args.json else _table(results))
    return 0


if __name__ == "__main__":
    with _quiet_keyboard_interrupt():
        sys.exit(main())
