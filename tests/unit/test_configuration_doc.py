from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_configuration_reference_is_current() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_configuration.py"),
                             "--check"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_settings_errors_name_the_option_and_variable() -> None:
    import pytest

    from runlease.errors import SettingsError
    from runlease.settings import WorkerSettings, load

    base = {"agent": "runlease.agents.script:agent", "database_url": "postgresql://x"}
    cases = {
        "heartbeat_interval_s": ({"heartbeat_interval_s": "30", "lease_s": "45"},
                                 "RUNLEASE_HEARTBEAT_INTERVAL_S"),
        "concurrency": ({"concurrency": "0"}, "RUNLEASE_CONCURRENCY"),
        "agent": ({"agent": "no.such.module:agent"}, "cannot import"),
        "agent form": ({"agent": "nocolon"}, "module:callable"),
        "pool": ({"pool": "Bad Pool"}, "RUNLEASE_POOL"),
        "lease": ({"lease_s": "abc"}, "RUNLEASE_LEASE_S"),
        "flag": ({"listen": "maybe"}, "RUNLEASE_LISTEN"),
        "pattern": ({"redact_patterns": "(unclosed"}, "RUNLEASE_REDACT_PATTERNS"),
    }
    for name, (given, expected) in cases.items():
        with pytest.raises(SettingsError) as err:
            load(WorkerSettings, base | given, environ={})
        assert expected in str(err.value), name
    # Without lease_s the pool's lease is checked against the heartbeat when
    # the worker has read the pool row.
    unresolved = load(WorkerSettings, base | {"heartbeat_interval_s": "30"}, environ={})
    with pytest.raises(SettingsError, match="RUNLEASE_HEARTBEAT_INTERVAL_S"):
        unresolved.with_pool_lease(45)
    assert unresolved.with_pool_lease(90).lease_s == 90
    assert load(WorkerSettings, base, environ={}).with_pool_lease(9).heartbeat_interval_s == 3
    # The environment is read when an option is not given; options win.
    settings = load(WorkerSettings, base | {"pool": "opt"},
                    environ={"RUNLEASE_POOL": "env", "RUNLEASE_CONCURRENCY": "3"})
    assert (settings.pool, settings.concurrency) == ("opt", 3)


def test_a_bad_worker_setting_stops_the_command_with_a_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "runlease", "worker", "--agent", "runlease.agents.script:agent",
         "--database-url", "postgresql://127.0.0.1:1/x", "--lease-s", "10",
         "--heartbeat-interval-s", "6"],
        capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 1
    assert "--heartbeat-interval-s (RUNLEASE_HEARTBEAT_INTERVAL_S)" in result.stderr
    assert "Traceback" not in result.stderr


def test_repeatable_options_also_split_on_commas() -> None:
    from runlease.settings import OperatorSettings, load

    settings = load(OperatorSettings, {"namespaces": ("agents,batch", "ml")}, environ={})
    assert settings.namespaces == ("agents", "batch", "ml")
    from_env = load(OperatorSettings, {}, environ={"RUNLEASE_NAMESPACES": "a, b"})
    assert from_env.namespaces == ("a", "b")
