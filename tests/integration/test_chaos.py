"""Crash and restart, end to end, bounded for CI (issue 11, item 11): four
`runlease worker` processes of the script agent, runs submitted through the
real `runlease api` process, a kill -9 of a random worker every ~2 s, and the
PostgreSQL server stopped (immediate shutdown) and started again mid-run.
bench/chaos.py runs the same harness longer and prints its figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.chaos import Chaos, ChaosConfig

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_chaos_kill_9_and_a_database_restart(tmp_path: Path) -> None:
    config = ChaosConfig(runs=120, chaos_s=30, db_restarts=1, stop_mode="immediate")
    f = Chaos(config, tmp_path).run()
    print("chaos figures: " + ", ".join(f"{k}={v}" for k, v in f.table()))
    print(f"details: {f.details}")

    # The chaos happened.
    assert f.kills >= 5
    assert f.db_restarts == 1
    assert "db_port_moved" not in f.details
    assert f.api_requests_in_outage > 0  # the API was asked while the database was down
    assert f.retried > 0
    # The invariants held.
    assert f.submitted == config.runs
    assert f.lost == 0, f.details["statuses"]
    assert f.done == config.runs
    assert f.attempts_over_max == 0
    assert f.event_seq_gaps == 0
    # An orphaned tool also shows as an overlap (it writes its last line
    # after the next attempt began): the cause is asserted first.
    assert f.orphaned_tools == 0, f.details["orphans"]
    assert f.overlapping_leases == 0, f.details["overlaps"]
    assert f.api_errors_after_restart == 0, f.details["api_errors_after_restart"]
    assert f.streams_broken == 0, f.details["streams_broken"]
    assert f.worker_exits == 0, f.details.get("worker_exit_logs")
