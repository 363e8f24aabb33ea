"""Worker processes under faults: SIGTERM drain, a cut network, kill -9 of the
reaper's leader, and chaos. Real `runlease worker` subprocesses, a real
PostgreSQL, real signals."""

from __future__ import annotations

import itertools
import random
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.proc import WorkerProcess, processes_with
from tests.support.proxy import CuttableProxy
from tests.support.waiting import until_sync
from tests.support.workers import HOST_FILES

pytestmark = pytest.mark.slow

FAST = {"lease_s": 4, "heartbeat_interval_s": 1, "poll_interval_s": 30,
        "reaper_interval_s": 0.5, "leader_ttl_s": 2}


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(name: str, url: str | None = None, **settings: Any) -> WorkerProcess:
        process = WorkerProcess(url or db_url, tmp_path, name, FAST | settings).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.cleanup()


def query(db_url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def enqueue(db_url: str, runs: list[dict[str, Any]], max_attempts: int = 3) -> None:
    import asyncio

    from runlease.db.connect import make_conn_pool
    from runlease.db.store import NewRun, RunStore

    async def go() -> None:
        async with make_conn_pool(db_url, max_size=1) as conn_pool:
            store = RunStore(conn_pool)
            for i in range(0, len(runs), 500):
                await store.enqueue_many("default", [NewRun("acme", r, max_attempts=max_attempts)
                                                     for r in runs[i:i + 500]])

    asyncio.run(go())


def test_sigterm_releases_runs_to_another_worker_at_once(db_url: str, workers: Any) -> None:
    a = workers("a", agent="tests.support.agents:sleepy", concurrency=3, drain_grace_s=1,
                reaper=False)
    enqueue(db_url, [{"seconds": 120}] * 3, max_attempts=1)
    until_sync(lambda: query(db_url, "SELECT count(*) FROM agent_run_events"
                                     " WHERE kind = 'started'")[0][0] == 3,
               what="three runs started on worker a")
    b = workers("b", agent="tests.support.agents:sleepy", concurrency=3, reaper=False)
    until_sync(lambda: "listener_connected" in b.log(), what="worker b listening")

    sent = time.monotonic()
    a.signal(signal.SIGTERM)
    assert a.wait(10) == 0
    exited = time.monotonic() - sent
    assert exited < 1 + 3, a.log()  # the 1 s grace, then release and exit

    # b polls only every 30 s: picking the runs up at once is the release's NOTIFY.
    rows = until_sync(
        lambda: (r := query(db_url, "SELECT attempts FROM agent_runs WHERE status = 'leased'"
                                    " AND locked_by LIKE 'pod-b:%%'")) and len(r) == 3 and r,
        timeout_s=5, what="worker b to claim the released runs")
    picked_up = time.monotonic() - sent
    # max_attempts is 1: the drained attempt was not charged, or b could not claim.
    assert [r[0] for r in rows] == [1, 1, 1]
    kinds = query(db_url, "SELECT kind, count(*) FROM agent_run_events GROUP BY kind ORDER BY 1")
    assert kinds == [("run.released", 3), ("started", 6)]
    print(f"drain: worker exited in {exited:.2f} s, runs resumed elsewhere after "
          f"{picked_up:.2f} s")


def test_a_cut_network_stops_the_run_before_its_lease_expires(
    db_url: str, workers: Any, tmp_path: Path
) -> None:
    host, port = _host_port(db_url)
    proxy = CuttableProxy(host, port)
    try:
        ticks = tmp_path / "ticks.txt"
        a = workers("a", url=proxy.url_for(db_url), agent="tests.support.agents:ticker",
                    reaper=False, **HOST_FILES)
        enqueue(db_url, [{"path": str(ticks)}], max_attempts=3)
        until_sync(lambda: ticks.exists() and len(ticks.read_text().splitlines()) > 10,
                   what="the tool to tick on worker a")
        time.sleep(1.5)  # let a renew at least once through the proxy
        proxy.cut()
        cut_at = time.time()
        time.sleep(0.5)  # a renewal in flight at the cut has settled by now
        # The run's lease is its holder incarnation's.
        (locked_until,) = query(db_url, "SELECT extract(epoch FROM w.expires_at)"
                                        "  FROM agent_runs r JOIN agent_run_workers w"
                                        "    ON w.id = r.locked_by")[0]
        workers("b", agent="tests.support.agents:ticker", reaper=True, **HOST_FILES)
        until_sync(lambda: query(db_url, "SELECT status FROM agent_runs")[0][0] == "done",
                   timeout_s=30, what="worker b to complete the run")
        lines = [line.split() for line in ticks.read_text().splitlines()]
        first = [float(ts) for attempt, ts in lines if attempt == "1"]
        second = [float(ts) for attempt, ts in lines if attempt == "2"]
        assert "run_self_fenced" in a.log(), a.log()
        assert second, "the run never resumed on worker b"
        margin = float(locked_until) - max(first)
        print(f"cut at {cut_at:.2f}; worker a's tool stopped {margin:.2f} s before its lease "
              f"expired; worker b resumed {min(second) - float(locked_until):.2f} s after")
        assert max(first) < float(locked_until)  # stopped before the lease could expire
        assert min(second) > float(locked_until)  # no overlap
        assert query(db_url, "SELECT attempts FROM agent_runs")[0][0] == 2
    finally:
        proxy.close()


def _host_port(url: str) -> tuple[str, int]:
    from psycopg import conninfo

    params = conninfo.conninfo_to_dict(url)
    return str(params.get("host", "127.0.0.1")), int(params.get("port", 5432))


def test_the_reaper_has_one_leader_and_hands_over_on_kill_9(db_url: str, workers: Any) -> None:
    a = workers("a", agent="tests.support.agents:echo")
    b = workers("b", agent="tests.support.agents:echo")

    def leader() -> str | None:
        rows = query(db_url, "SELECT leader_id FROM runlease_leaders"
                             " WHERE name = 'reaper' AND expires_at > now()")
        return rows[0][0] if rows else None

    try:
        first = until_sync(leader, what="a leader")
    except AssertionError as exc:  # seen once in a full run: say what the workers did
        raise AssertionError(f"{exc}\n--- a:\n{a.log()}\n--- b:\n{b.log()}") from exc
    holders = set()
    for _ in range(20):  # one leader, the same one, while both live
        holders.add(leader())
        time.sleep(0.1)
    assert holders == {first}
    assert sum("leader_elected" in p.log() for p in (a, b)) == 1

    victim, survivor = (a, b) if first.startswith("pod-a:") else (b, a)
    victim.kill9()
    killed = time.monotonic()
    new = until_sync(lambda: (x := leader()) and x.startswith(survivor.identity_prefix) and x,
                     timeout_s=10, what="the survivor to take over")
    took = time.monotonic() - killed
    print(f"leadership moved to {new} {took:.2f} s after kill -9 (TTL 2 s)")
    assert took <= 2 + 2 / 3 + 0.5  # one TTL, plus one election interval


def test_chaos_kill_9_every_two_seconds(db_url: str, workers: Any, tmp_path: Path) -> None:
    rng = random.Random(2026)
    log = tmp_path / "executions.log"
    total = 1000
    runs = []
    for _ in range(total):
        shell = ["sh", "-c", f'echo "$RUNLEASE_RUN_ID $RUNLEASE_STEP $RUNLEASE_LEASE_EPOCH'
                             f' $(date +%s.%N)" >> {log}']
        runs.append({"steps": [{"sleep": round(rng.uniform(0.05, 0.3), 3)},
                               {"shell": shell},
                               {"sleep": round(rng.uniform(0.05, 0.3), 3)},
                               {"shell": shell}]})
    settings = {"agent": "runlease.agents.script:agent", "lease_s": 3,
                "heartbeat_interval_s": 1, "poll_interval_s": 0.5, "concurrency": 10,
                "leader_ttl_s": 2, "reaper_interval_s": 0.5, "drain_grace_s": 1,
                **HOST_FILES}  # the tools log to the test's executions.log
    live = [workers(f"w{i}", **settings) for i in range(4)]
    enqueue(db_url, runs, max_attempts=10)
    kills = 0
    started = time.monotonic()
    while True:
        left = query(db_url, "SELECT count(*) FROM agent_runs"
                             " WHERE status NOT IN ('done', 'dead', 'cancelled')")[0][0]
        if left == 0:
            break
        assert time.monotonic() - started < 240, f"{left} runs still unfinished"
        time.sleep(2)
        if left > 0:  # keep killing while there is work to lose
            victim = live.pop(rng.randrange(len(live)))
            victim.kill9()
            kills += 1
            live.append(workers(f"w{4 + kills}", **settings))
    elapsed = time.monotonic() - started

    statuses = dict(query(db_url, "SELECT status, count(*) FROM agent_runs GROUP BY 1"))
    assert sum(statuses.values()) == total
    assert set(statuses) <= {"done", "dead", "cancelled"}
    over = query(db_url, "SELECT count(*) FROM agent_runs WHERE attempts > max_attempts")
    assert over == [(0,)]
    retried = query(db_url, "SELECT count(*) FROM agent_runs WHERE attempts > 1")[0][0]

    # Executions, from the tools' own log: (run, step) -> [(epoch, time)].
    executions: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    per_run: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for line in log.read_text().splitlines():
        run_id, step, epoch, ts = line.split()
        executions[(run_id, step)].append((int(epoch), float(ts)))
        per_run[run_id].append((int(epoch), float(ts)))
    # Committed steps, with the worker-side instants the script agent records.
    committed = query(db_url, "SELECT run_id::text, step_key, lease_epoch,"
                              " (result->>'started_at')::float, (result->>'ended_at')::float"
                              " FROM agent_run_steps")
    for run_id, key, epoch, t0, t1 in committed:
        per_run[run_id].append((epoch, t0))
        per_run[run_id].append((epoch, t1))
        # A committed step is never executed again by a later lease.
        later = [e for e, _ in executions.get((run_id, key), []) if e > epoch]
        assert not later, f"step {key} of run {run_id} committed at epoch {epoch} ran again"
    # Leases never overlapped in time: every instant seen under epoch k comes
    # before every instant seen under a later epoch.
    overlaps = []
    for run_id, samples in per_run.items():
        by_epoch: dict[int, list[float]] = defaultdict(list)
        for epoch, ts in samples:
            by_epoch[epoch].append(ts)
        epochs = sorted(by_epoch)
        for earlier, later in itertools.pairwise(epochs):
            if max(by_epoch[earlier]) >= min(by_epoch[later]):
                overlaps.append((run_id, sorted(samples)))
    assert not overlaps, overlaps
    print(f"chaos: {total} runs, {kills} kill -9s, {retried} runs retried, "
          f"statuses {statuses}, {elapsed:.0f} s")
    assert kills >= 5
    assert retried > 0  # the kills really interrupted runs
    assert processes_with(str(log)) == []
