"""The owner of an embedded PostgreSQL's folder (db/folder_lock.py): one at
a time, the one refused is told whom to stop, and a dead owner's lock (kill
-9) is free at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runlease.db.folder_lock import LOCK_FILE, FolderBusy, FolderLock
from tests.support.proc import ROOT

HOLD = """
import sys, time
from pathlib import Path
from runlease.db.folder_lock import FolderLock
lock = FolderLock(Path(sys.argv[1]), command="runlease dev")
lock.acquire()
lock.describe(api="http://127.0.0.1:8091")
print("held", flush=True)
time.sleep(600)
"""


def hold(folder: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "held\n"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.stdout is not None
    proc.stdout.close()


def test_a_second_owner_is_refused_with_the_first_ones_pid_and_url(tmp_path: Path) -> None:
    first = hold(tmp_path)
    try:
        with pytest.raises(FolderBusy) as refused, FolderLock(tmp_path, command="runlease dev"):
            pass
        message = str(refused.value)
        assert f"runlease dev (pid {first.pid}, API http://127.0.0.1:8091)" in message
        assert "--data-dir" in message
    finally:
        stop(first)
    # Killed without a chance to clean up: the kernel dropped its lock.
    with FolderLock(tmp_path, command="runlease dev") as lock:
        lock.describe(api="http://127.0.0.1:8080")
        assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_FILE).read_text()


def test_a_released_lock_is_free_again_and_says_no_owner(tmp_path: Path) -> None:
    with FolderLock(tmp_path, command="runlease migrate"):
        pass
    assert (tmp_path / LOCK_FILE).read_text() == ""
    with FolderLock(tmp_path, command="runlease dev"):
        pass


def test_a_hostile_owner_file_is_not_trusted(tmp_path: Path) -> None:
    """Whatever the file holds (garbage, a huge JSON, a list), the refusal
    is still one bounded line."""
    first = hold(tmp_path)
    try:
        for junk in (
            b"\xff\x00not json",
            b"[1, 2]",
            b'{"pid": "' + b"x" * 100_000 + b'"}',
            b'{"pid": "1", "api": "' + b"\\u001b[2J" * 300 + b'"}',
        ):
            (tmp_path / LOCK_FILE).write_bytes(junk)
            with pytest.raises(FolderBusy) as refused, FolderLock(tmp_path, command="runlease dev"):
                pass
            assert len(str(refused.value)) < 1000
            assert "pid ?" in str(refused.value)
    finally:
        stop(first)
