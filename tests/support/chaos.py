"""Crash and restart, end to end: the harness behind tests/integration/test_chaos.py
(bounded, in CI) and bench/chaos.py (longer, configurable).

What runs: a PostgreSQL server of its own (it is stopped and started again
mid-run, on the same port and data directory), the real `runlease api`
process, and `runlease worker` processes of the script agent. Runs are
submitted through the HTTP API (the client SDK, with idempotency keys) while
a random worker is killed with SIGKILL every few seconds and replaced, and
the database is stopped (fast or immediate shutdown) and started again.
A prober reads through the API all along; a few clients follow event streams.

The evidence for the invariants, gathered at the end:
- every run `done`, none lost (every acknowledged submit is a row);
- leases never overlapped: every instant seen under lease epoch k of a run is
  before every instant seen under a later epoch. The instants are the script
  agent's committed step results (start and end, with their epoch) and the
  tools' own log lines (each shell step writes its run, epoch and the time
  when it starts and when it ends), which also covers attempts whose steps
  were never committed; a tool runs within its attempt;
- attempts <= max_attempts;
- each run's event seqs are 1..n, n = the run's event_seq, without a gap;
- no tool outlives its killed worker: the worker's descendants are listed
  just before the kill -9 and must all be gone within a grace; at the end no
  process at all carries one of the runs' RUNLEASE_RUN_ID in its environment
  (every run is done, so no tool may still run);
- the API answers through the database restart: a request that started after
  the server accepted connections again, and did not overlap an outage, must
  not fail.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import psycopg

from runlease.client import ApiError, Client, RunEnded, StreamEvent
from runlease.db.embedded import EmbeddedPostgres
from tests.support.api import TOKENS
from tests.support.api_process import ApiProcess
from tests.support.pg import own_postgres
from tests.support.pgbouncer import running_pgbouncer
from tests.support.proc import WorkerProcess
from tests.support.workers import HOST_FILES

WORKER_SETTINGS: dict[str, Any] = {
    "agent": "runlease.agents.script:agent", "lease_s": 3, "heartbeat_interval_s": 1,
    "poll_interval_s": 0.5, "leader_ttl_s": 2, "reaper_interval_s": 0.5, "drain_grace_s": 1,
    # The tools log to the harness's own file (tools.log): unsandboxed.
    **HOST_FILES,
}


@dataclass(frozen=True)
class ChaosConfig:
    runs: int = 120
    chaos_s: float = 30.0  # workers are killed for this long; submits spread over 60 % of it
    kill_every_s: float = 2.0
    workers: int = 4
    concurrency: int = 8
    db_restarts: int = 1  # spread evenly over chaos_s
    db_down_s: float = 2.0  # between the end of the stop and the start
    stop_mode: str = "immediate"  # pg_ctl -m: fast or immediate
    long_tool_s: float = 6.0  # every long_tool_every-th run has a tool this long
    long_tool_every: int = 4
    followers: int = 4  # runs followed by client.events() through the chaos
    # A burst of this many requests at once goes out just before each stop
    # (the API's connection pool then holds that many to lose) and just
    # after the server accepts connections again.
    burst: int = 12
    # The submitter and the prober wait while the database is down, as an API
    # idle through an outage would. Off: they keep asking, and the event
    # streams' polls keep asking anyway, which discards dead pooled
    # connections during the outage (tests/integration/test_api_db_restart.py
    # is the test of an idle API's pool).
    quiet_outage: bool = False
    max_attempts: int = 25
    # The API and the workers reach the database through a real PgBouncer in
    # transaction pooling mode (tests/support/pgbouncer.py), prepared
    # statements off; their LISTEN sessions use the direct URL.
    pgbouncer: bool = False
    settle_s: float = 120.0  # after the chaos, time for every run to finish
    orphan_grace_s: float = 3.0  # a killed worker's tools must be gone by then
    seed: int = 2026


@dataclass
class ChaosFigures:
    runs: int = 0
    submitted: int = 0
    kills: int = 0
    db_restarts: int = 0
    done: int = 0
    lost: int = 0  # not done at the end, or an acknowledged submit with no row
    retried: int = 0  # runs that took more than one attempt
    max_attempts_seen: int = 0
    overlapping_leases: int = 0  # pairs of consecutive epochs of a run that overlapped
    overlapping_leases_steps_only: int = 0  # the same, from committed steps alone
    attempts_over_max: int = 0
    event_seq_gaps: int = 0
    orphaned_tools: int = 0
    api_errors_after_restart: int = 0  # failed requests that did not overlap an outage
    api_errors_in_outage: int = 0  # failed requests that overlapped one (expected)
    api_requests: int = 0
    api_requests_in_outage: int = 0  # requests that overlapped an outage, failed or not
    outage_s: float = 0.0  # from each stop's start until the server accepted connections
    streams_broken: int = 0  # followers that raised, or saw seqs other than 1..n
    worker_exits: int = 0  # workers that exited without being killed
    elapsed_s: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def table(self) -> list[tuple[str, Any]]:
        return [(k, round(v, 1) if isinstance(v, float) else v)
                for k, v in asdict(self).items() if k != "details"]


# -- /proc -------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in ticks) of a process, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[19])


def descendants(pid: int) -> set[tuple[int, int]]:
    """(pid, start time) of every live descendant of pid."""
    children: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) and st[0] != "Z":
            children[st[1]].append((int(entry.name), st[2]))
    found: set[tuple[int, int]] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child[0])
    return found


def still_alive(procs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Those of procs that live (same start time: not a reused pid), not zombies."""
    return {(pid, start) for pid, start in procs
            if (st := _stat(pid)) is not None and st[0] != "Z" and st[2] == start}


def processes_of_runs(run_ids: set[str]) -> set[tuple[int, int]]:
    """Live processes whose environment names one of the runs (RUNLEASE_RUN_ID),
    as every tool's does."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"RUNLEASE_RUN_ID=") and item[16:].decode() in run_ids:
                st = _stat(int(entry.name))
                if st is not None and st[0] != "Z":
                    found.add((int(entry.name), st[2]))
                break
    return found


# -- the run -------------------------------------------------------------------------------


@dataclass
class _Request:
    what: str
    started: float
    ended: float
    error: str | None


class Chaos:
    def __init__(self, config: ChaosConfig, work_dir: Path | None = None) -> None:
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.dir = work_dir or Path(tempfile.mkdtemp(prefix="runlease-chaos-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tool_log = self.dir / "tools.log"
        self.figures = ChaosFigures(runs=config.runs)
        self.outages: list[tuple[float, float]] = []  # (stop began, server accepts again)
        self.requests: list[_Request] = []
        self.run_ids: list[str] = []
        self.orphans: set[tuple[int, int]] = set()
        self.streams: dict[str, list[StreamEvent | RunEnded] | BaseException] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._db_up = threading.Event()
        self._db_up.set()
        self._names = itertools.count()
        self.workers: list[WorkerProcess] = []
        self._all_workers: list[WorkerProcess] = []
        self.extra: dict[str, Any] = {}  # settings of every worker and the API

    # -- inputs ---------------------------------------------------------------------------

    def _tool(self, seconds: float) -> list[str]:
        stamp = f'echo "$RUNLEASE_RUN_ID $RUNLEASE_LEASE_EPOCH $(date +%s.%N)" >> {self.tool_log}'
        return ["sh", "-c", f"{stamp}; sleep {seconds}; {stamp}"]

    def run_input(self, i: int) -> dict[str, Any]:
        r = self.rng
        steps: list[dict[str, Any]] = [
            {"sleep": round(r.uniform(0.05, 0.3), 3)},
            {"shell": self._tool(0.5)},
            {"emit": {"i": i}},
            {"sleep": round(r.uniform(0.05, 0.3), 3)},
            {"shell": self._tool(round(r.uniform(0.1, 0.5), 2))},
            {"emit": {"i": i, "last": True}},
        ]
        if i % self.cfg.long_tool_every == 0:
            steps.insert(3, {"shell": self._tool(self.cfg.long_tool_s)})
        return {"steps": steps}

    # -- processes ------------------------------------------------------------------------

    def _through_bouncer(self, direct_url: str) -> dict[str, Any]:
        """The settings of a process whose database_url is PgBouncer's."""
        if not self.cfg.pgbouncer:
            return {}
        return {"listen_database_url": direct_url, "prepared_statements": False}

    def _start_worker(self, url: str) -> WorkerProcess:
        settings = WORKER_SETTINGS | {"concurrency": self.cfg.concurrency} | self.extra
        worker = WorkerProcess(url, self.dir, f"w{next(self._names)}", settings).start()
        self._all_workers.append(worker)
        return worker

    def _kill_one(self, url: str) -> None:
        victim = self.workers.pop(self.rng.randrange(len(self.workers)))
        assert victim.proc is not None
        tools = descendants(victim.proc.pid)
        victim.kill9()
        self.figures.kills += 1
        self.workers.append(self._start_worker(url))
        deadline = time.monotonic() + self.cfg.orphan_grace_s
        while (left := still_alive(tools)) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.orphans |= left

    def _replace_exited(self, url: str) -> None:
        for worker in list(self.workers):
            assert worker.proc is not None
            if worker.proc.poll() is not None:
                self.figures.worker_exits += 1
                self.figures.details.setdefault("worker_exit_logs", []).append(
                    worker.log()[-2000:])
                self.workers.remove(worker)
                self.workers.append(self._start_worker(url))

    # -- threads --------------------------------------------------------------------------

    def _record(self, what: str, started: float, error: str | None) -> None:
        with self._lock:
            self.requests.append(_Request(what, started, time.monotonic(), error))

    def _submitter(self, api_url: str) -> None:
        spread = self.cfg.chaos_s * 0.6
        began = time.monotonic()
        with Client(api_url, TOKENS["acme"], timeout_s=30) as client:
            for i in range(self.cfg.runs):
                due = began + spread * i / self.cfg.runs
                while (now := time.monotonic()) < due:
                    time.sleep(min(0.05, due - now))
                # Built once: a retry must send the same input under the same key
                # (run_input draws from the rng; a second draw is another input,
                # which the server rightly refuses with 409 idempotency_conflict).
                body = self.run_input(i)
                while True:  # the same idempotency key: a retry never makes a second run
                    if self._stop.is_set():  # the chaos ended early (a failure)
                        return
                    self._quiet()
                    t0 = time.monotonic()
                    try:
                        run = client.submit(body, max_attempts=self.cfg.max_attempts,
                                            idempotency_key=f"chaos-{i}")
                    except (ApiError, httpx.HTTPError) as exc:
                        self._record("submit", t0, f"{type(exc).__name__}: {exc}")
                        time.sleep(0.2)
                        continue
                    self._record("submit", t0, None)
                    break
                with self._lock:
                    self.run_ids.append(str(run.id))
                if self.cfg.followers and i % max(1, self.cfg.runs // self.cfg.followers) == 0:
                    threading.Thread(target=self._follow, args=(api_url, run.id),
                                     name=f"follow-{i}", daemon=True).start()

    def _prober(self, api_url: str) -> None:
        with Client(api_url, TOKENS["acme"], timeout_s=30) as client:
            while not self._stop.is_set():
                self._quiet()
                with self._lock:
                    known = self.run_ids[0] if self.run_ids else None
                for what in ("get", "list"):
                    t0 = time.monotonic()
                    try:
                        if what == "get" and known:
                            client.get(known)
                        elif what == "list":
                            client.list(limit=1)
                        else:
                            continue
                    except (ApiError, httpx.HTTPError) as exc:
                        self._record(what, t0, f"{type(exc).__name__}: {exc}")
                    else:
                        self._record(what, t0, None)
                self._stop.wait(0.1)

    def _follow(self, api_url: str, run_id: UUID) -> None:
        items: list[StreamEvent | RunEnded] = []
        try:
            with Client(api_url, TOKENS["acme"], timeout_s=30) as client:
                for item in client.events(run_id, read_timeout_s=30):
                    items.append(item)
        except BaseException as exc:  # recorded, judged at the end
            self.streams[str(run_id)] = exc
            return
        self.streams[str(run_id)] = items

    def _quiet(self) -> None:
        if self.cfg.quiet_outage:
            self._db_up.wait()

    def _burst(self, api_url: str) -> None:
        """Requests at once, each on its own connection to the API, so the
        API's connection pool holds (or is asked for) that many connections."""
        def one(_: int) -> None:
            with Client(api_url, TOKENS["acme"], timeout_s=30) as client:
                t0 = time.monotonic()
                try:
                    client.list(limit=1)
                except (ApiError, httpx.HTTPError) as exc:
                    self._record("burst", t0, f"{type(exc).__name__}: {exc}")
                else:
                    self._record("burst", t0, None)

        with ThreadPoolExecutor(self.cfg.burst) as pool:
            list(pool.map(one, range(self.cfg.burst)))

    def _restart_db(self, pg: EmbeddedPostgres, api_url: str) -> None:
        self._burst(api_url)
        self._db_up.clear()
        try:
            down, port = time.monotonic(), pg.port
            pg.stop(self.cfg.stop_mode)
            time.sleep(self.cfg.db_down_s)
            pg.start()  # the same port and data directory; returns once it accepts connections
            if pg.port != port:  # someone took the port meanwhile: nobody could reconnect
                self.figures.details["db_port_moved"] = (port, pg.port)
            with self._lock:
                self.outages.append((down, time.monotonic()))
            self.figures.db_restarts += 1
            self._burst(api_url)
        finally:
            self._db_up.set()

    # -- the whole ------------------------------------------------------------------------

    def run(self) -> ChaosFigures:
        started = time.monotonic()
        with contextlib.ExitStack() as stack:
            pg = stack.enter_context(own_postgres(durable=True))
            # Judging always reads through the direct URL.
            direct = pg.url
            url = direct
            if self.cfg.pgbouncer:
                url = stack.enter_context(running_pgbouncer(direct)).url(direct)
                self.extra = self._through_bouncer(direct)
            api = ApiProcess(url, self.dir)
            api.env.update({"RUNLEASE_" + k.upper(): str(v).lower() if isinstance(v, bool)
                            else str(v) for k, v in self.extra.items()})
            api.start()
            try:
                self.workers = [self._start_worker(url) for _ in range(self.cfg.workers)]
                self._chaos(pg, url, api)
                self._settle(url, direct)
                self.orphans |= processes_of_runs(set(self.run_ids))
                self._judge(direct)
            finally:
                self._stop.set()
                for worker in self._all_workers:
                    worker.cleanup()
                api.cleanup()
                for pid, _ in still_alive(self.orphans):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        self.figures.elapsed_s = time.monotonic() - started
        return self.figures

    def _chaos(self, pg: EmbeddedPostgres, url: str, api: ApiProcess) -> None:
        threads = [threading.Thread(target=self._submitter, args=(api.url,), name="submitter",
                                    daemon=True),
                   threading.Thread(target=self._prober, args=(api.url,), name="prober",
                                    daemon=True)]
        for t in threads:
            t.start()
        began = time.monotonic()
        restarts_due = [began + self.cfg.chaos_s * (k + 1) / (self.cfg.db_restarts + 1)
                        for k in range(self.cfg.db_restarts)]
        restarter: threading.Thread | None = None
        next_kill = began + self.cfg.kill_every_s
        while time.monotonic() - began < self.cfg.chaos_s:
            now = time.monotonic()
            if restarts_due and now >= restarts_due[0] and (
                    restarter is None or not restarter.is_alive()):
                restarts_due.pop(0)
                restarter = threading.Thread(target=self._restart_db, args=(pg, api.url),
                                             name="db-restart")
                restarter.start()
            if now >= next_kill:
                self._kill_one(url)
                next_kill = time.monotonic() + self.rng.uniform(0.5, 1.5) * self.cfg.kill_every_s
            self._replace_exited(url)
            time.sleep(0.05)
        if restarter is not None:
            restarter.join()
        threads[0].join(self.cfg.chaos_s + 120)  # every run submitted
        if threads[0].is_alive():  # a submit kept failing: say why instead of hanging
            self._stop.set()
            threads[0].join(10)
            with self._lock:
                errors = [r.error for r in self.requests if r.error][-5:]
            raise AssertionError(f"the submitter never finished: port moved "
                                 f"{self.figures.details.get('db_port_moved')}, "
                                 f"last errors {errors}")

    def _settle(self, url: str, direct_url: str) -> None:
        deadline = time.monotonic() + self.cfg.settle_s
        while time.monotonic() < deadline:
            self._replace_exited(url)
            with psycopg.connect(direct_url, autocommit=True) as conn:
                left = conn.execute("SELECT count(*) FROM agent_runs WHERE status NOT IN"
                                    " ('done', 'dead', 'cancelled')").fetchone()
            if left is not None and left[0] == 0:
                break
            time.sleep(0.2)
        # The followers end with their runs.
        end = time.monotonic() + 10
        while len(self.streams) < self._followed() and time.monotonic() < end:
            time.sleep(0.05)
        self._stop.set()

    def _followed(self) -> int:
        if not self.cfg.followers:
            return 0
        step = max(1, self.cfg.runs // self.cfg.followers)
        return len(range(0, self.cfg.runs, step))

    # -- judging --------------------------------------------------------------------------

    def _judge(self, url: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            runs = conn.execute("SELECT id::text, status, attempts, max_attempts, event_seq"
                                " FROM agent_runs").fetchall()
            seqs: dict[str, list[int]] = defaultdict(list)
            for run_id, seq in conn.execute("SELECT run_id::text, seq FROM agent_run_events"
                                            " ORDER BY run_id, seq"):
                seqs[run_id].append(seq)
            steps = conn.execute("SELECT run_id::text, lease_epoch,"
                                 " (result->>'started_at')::float, (result->>'ended_at')::float"
                                 " FROM agent_run_steps").fetchall()
        by_id = {r[0]: r for r in runs}
        self._judge_runs(by_id, seqs)
        self._judge_overlaps(steps)
        self._judge_api()
        self._judge_streams(by_id)
        self.figures.orphaned_tools = len(self.orphans)
        self.figures.details["orphans"] = sorted(self.orphans)[:20]

    def _judge_runs(self, by_id: dict[str, tuple[Any, ...]], seqs: dict[str, list[int]]) -> None:
        f, runs = self.figures, list(by_id.values())
        f.submitted = len(self.run_ids)
        f.done = sum(1 for r in runs if r[1] == "done")
        f.lost = sum(1 for i in self.run_ids if i not in by_id or by_id[i][1] != "done")
        f.lost += self.cfg.runs - len(set(self.run_ids))
        f.retried = sum(1 for r in runs if r[2] > 1)
        f.max_attempts_seen = max((r[2] for r in runs), default=0)
        f.attempts_over_max = sum(1 for r in runs if r[2] > r[3])
        f.event_seq_gaps = sum(1 for r in runs if seqs.get(r[0], []) != list(range(1, r[4] + 1)))
        statuses: dict[str, int] = defaultdict(int)
        for r in runs:
            statuses[r[1]] += 1
        f.details["statuses"] = dict(statuses)

    def _judge_overlaps(self, steps: list[tuple[Any, ...]]) -> None:
        """Instants seen under each lease epoch of each run: committed steps
        (the agent's own clock) and the tools' log lines."""
        from_steps: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for run_id, epoch, t0, t1 in steps:
            from_steps[run_id][epoch] += [t0, t1]
        every: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for run_id, epochs in from_steps.items():
            for epoch, instants in epochs.items():
                every[run_id][epoch] += instants
        if self.tool_log.exists():
            for line in self.tool_log.read_text().splitlines():
                parts = line.split()
                if len(parts) == 3:
                    every[parts[0]][int(parts[1])].append(float(parts[2]))
        overlaps = _overlaps(every)
        self.figures.overlapping_leases = len(overlaps)
        self.figures.overlapping_leases_steps_only = len(_overlaps(from_steps))
        self.figures.details["overlaps"] = overlaps[:20]

    def _judge_api(self) -> None:
        def in_outage(r: _Request) -> bool:
            return any(r.started <= up and r.ended >= down for down, up in self.outages)

        f = self.figures
        failed = [r for r in self.requests if r.error]
        f.api_requests = len(self.requests)
        f.api_errors_in_outage = sum(1 for r in failed if in_outage(r))
        f.api_requests_in_outage = sum(1 for r in self.requests if in_outage(r))
        f.outage_s = sum(up - down for down, up in self.outages)
        after = [r for r in failed if not in_outage(r)]
        f.api_errors_after_restart = len(after)
        f.details["api_errors_after_restart"] = [(r.what, r.error) for r in after[:10]]

    def _judge_streams(self, by_id: dict[str, tuple[Any, ...]]) -> None:
        broken = {}
        for run_id, got in self.streams.items():
            if isinstance(got, BaseException):
                broken[run_id] = repr(got)
                continue
            events = [e.seq for e in got if isinstance(e, StreamEvent)]
            ended = bool(got) and isinstance(got[-1], RunEnded)
            expected = list(range(1, by_id[run_id][4] + 1)) if run_id in by_id else None
            if events != expected or not ended:
                broken[run_id] = f"seqs {events}, expected {expected}, ended {ended}"
        self.figures.streams_broken = len(broken) + self._followed() - len(self.streams)
        self.figures.details["streams_broken"] = broken


def _overlaps(seen: dict[str, dict[int, list[float]]]) -> list[tuple[str, int, int, float]]:
    """(run, epoch, later epoch, seconds of overlap) wherever an instant seen
    under an epoch is not before every instant of the next epoch seen. Checking
    neighbours suffices: if each epoch ends before the next begins, all do."""
    found = []
    for run_id, epochs in seen.items():
        for earlier, later in itertools.pairwise(sorted(epochs)):
            if max(epochs[earlier]) >= min(epochs[later]):
                found.append((run_id, earlier, later,
                              round(max(epochs[earlier]) - min(epochs[later]), 3)))
    return found
