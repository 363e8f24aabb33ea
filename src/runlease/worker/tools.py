"""Tool processes: each in its own process group, killed as a group.

A tool (a shell command, a compiler, a test run) may start children of its
own; signalling only the direct child would leave them running after a Stop.
So every tool starts a new session (its own process group), and stopping it
sends SIGTERM to the whole group, then SIGKILL once the grace has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runlease.worker.errors import RunCancelled, ToolTimeout

log = logging.getLogger(__name__)

OUTPUT_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ToolResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def group_alive(pgid: int) -> bool:
    """Is any process of the group still running? Zombies do not count: a
    killed tool's children are reparented to PID 1, which may reap them late
    (or never, in a container without an init), and waiting for a zombie to
    disappear would only spend the grace for nothing."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields: state, ppid, pgrp, ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


async def terminate_group(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM to the process group, SIGKILL after grace_s; reaps the leader."""
    pgid = proc.pid  # a session leader's pgid is its pid
    if grace_s > 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while group_alive(pgid) and time.monotonic() < deadline:
            if proc.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 0.05)
            else:
                await asyncio.sleep(0.05)  # children may outlive the leader briefly
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    await proc.wait()


async def _tail(stream: asyncio.StreamReader | None) -> bytes:
    """Read a stream to its end, keeping only the last OUTPUT_TAIL_BYTES."""
    if stream is None:
        return b""
    kept = bytearray()
    while chunk := await stream.read(65536):
        kept += chunk
        if len(kept) > OUTPUT_TAIL_BYTES:
            del kept[: len(kept) - OUTPUT_TAIL_BYTES]
    return bytes(kept)


class ToolRunner:
    """Runs one run's tools; knows how hard to stop them."""

    def __init__(self, cancel: asyncio.Event, kill_grace_s: float) -> None:
        self.cancel = cancel
        self.kill_grace_s = kill_grace_s
        self.hard = False  # lease lost or self-fenced: SIGKILL at once
        self.live: set[asyncio.subprocess.Process] = set()

    def grace(self) -> float:
        return 0.0 if self.hard else self.kill_grace_s

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ToolResult:
        if not argv:
            raise ValueError("argv must not be empty")
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=None if env is None else dict(env),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )
        self.live.add(proc)
        log.debug("tool_started pid=%s argv=%s", proc.pid, argv[0])
        output: asyncio.Future[Any] = asyncio.gather(_tail(proc.stdout), _tail(proc.stderr),
                                                     proc.wait())
        cancelled: asyncio.Future[Any] = asyncio.ensure_future(self.cancel.wait())
        try:
            done, _ = await asyncio.wait({output, cancelled}, timeout=timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if output in done:
                out, err, code = output.result()
                return ToolResult(tuple(argv), code, out.decode(errors="replace"),
                                  err.decode(errors="replace"), time.monotonic() - started)
            await asyncio.shield(self._stop(proc, output))
            if cancelled in done:
                raise RunCancelled(f"tool {argv[0]} stopped: the run was cancelled")
            raise ToolTimeout(f"tool {argv[0]} ran over its {timeout_s} s timeout")
        except asyncio.CancelledError:
            await asyncio.shield(self._stop(proc, output))
            raise
        finally:
            cancelled.cancel()
            self.live.discard(proc)

    async def _stop(self, proc: asyncio.subprocess.Process, output: asyncio.Future[Any]) -> None:
        await terminate_group(proc, self.grace())
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(output, 1.0)

    async def kill_all(self) -> None:
        await asyncio.gather(*(terminate_group(p, self.grace()) for p in list(self.live)),
                             return_exceptions=True)
