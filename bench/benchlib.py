"""Shared plumbing for the benchmarks in bench/: a server, processes, tables.

Benchmarks print figures; they assert nothing about speed (this machine is
shared and noisy). Every comparison is made in one run, on one server.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from runlease.db.embedded import EmbeddedPostgres
from runlease.db.migrate import migrate
from runlease.db.workers import Registration, WorkerStore


def server_cpu_s(url: str) -> float | None:
    """CPU seconds (user + system) the server on this machine has used: the
    postmaster, its live children (backends, walwriter...) and the children
    it has reaped. None when it is not a local server whose processes can be
    read. A drain's server CPU per run, unlike its rate, hardly moves with
    the neighbours' load."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT pid FROM pg_stat_activity"
                               " WHERE backend_type = 'checkpointer'").fetchone()
        if row is None:
            return None
        postmaster = int(Path(f"/proc/{row[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid = int(stat.parent.name)
            if pid == postmaster:  # its own time and its reaped children's
                total += sum(int(f) for f in fields[11:15]) / tick
            elif int(fields[1]) == postmaster:
                total += (int(fields[11]) + int(fields[12])) / tick
        return total
    except (OSError, ValueError, IndexError, psycopg.Error):
        return None


@contextmanager
def server(url: str | None, durable: bool = True) -> Iterator[str]:
    """The given URL, or a fresh embedded PostgreSQL (durable, as in production)."""
    if url:
        yield url
        return
    data = Path(tempfile.mkdtemp(prefix="runlease-bench-"))
    data.chmod(0o755)
    pg = EmbeddedPostgres(data, durable=durable)
    pg.start()
    try:
        yield pg.url
    finally:
        pg.stop("immediate")
        shutil.rmtree(data, ignore_errors=True)


def fresh_database(url: str, name: str) -> str:
    """(Re)create database `name` on the server, migrated; returns its URL."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["dbname"] = name
    db_url = psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]
    migrate(db_url)
    return db_url


async def incarnation(store: WorkerStore, name: str, pool: str, lease_s: int = 3600) -> str:
    """Register a worker incarnation for a bench's own claims and return its
    id (`name` and a random suffix: ids are never reused). A lease belongs
    to its holder's incarnation (migration 0015): claims need a live one, and
    this one lives lease_s without a heartbeat, longer than any bench."""
    worker = f"{name}:{uuid.uuid4().hex[:12]}"
    await store.register_worker(Registration(worker, pool, 0), lease_s=lease_s)
    return worker


def timed_processes(
    target: Callable[..., None], args_for: Callable[[int], tuple[Any, ...]], n: int,
    timeout_s: float = 600,
) -> tuple[float, list[Any]]:
    """Start n processes, release them at once, wait for all; returns
    (seconds from release to the last one done, what each put on its queue)."""
    ctx = mp.get_context("spawn")
    ready = ctx.Barrier(n + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(i), ready, results), daemon=True)
             for i in range(n)]
    for p in procs:
        p.start()
    try:
        ready.wait(timeout=60)
        t0 = time.perf_counter()
        out = [results.get(timeout=timeout_s) for _ in procs]
        elapsed = time.perf_counter() - t0
        for p in procs:
            p.join(timeout=30)
        return elapsed, out
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for j, row in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(row, widths, strict=True))))
        if j == 0:
            print("  ".join("-" * w for w in widths))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def emit_json(figures: dict[str, Any]) -> None:
    print(json.dumps(figures, indent=2, default=str))


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "pid": os.getpid()}
