"""Tool processes: each in its own process group, killed as a group.

A tool (a shell command, a compiler, a test run) may start children of its
own; signalling only the direct child would leave them running after a Stop.
So every tool starts a new session (its own process group), and stopping it
sends SIGTERM to the whole group, then SIGKILL once the grace has passed.

The session's leader is a guard (worker/toolguard.py) that starts the tool
and kills the whole group, and every descendant, when the worker dies: no
tool outlives its worker, even one killed with SIGKILL. When the tool's main
process has ended and its output is closed, whatever it left running in its
group is stopped the same way (SIGTERM, SIGKILL after the grace): a tool call
leaves nothing behind. The tool's environment is built by worker/toolenv.py:
an allowlist, the pool's grants, and never the worker's secrets.

With a sandbox (worker/sandbox.py), the guard starts bwrap instead of the
tool: the tool runs in its own namespaces with the run's own directory,
under limits, and its whole PID namespace dies with its main process. The
run's directory is measured while a tool runs: past the pool's disk limit the
tool is killed and the call fails (ToolLimitExceeded).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runlease import logs, tracing
from runlease.worker import toolenv
from runlease.worker.errors import FatalError, RunCancelled, ToolTimeout
from runlease.worker.sandbox import INSIDE_TMP, INSIDE_WORK, Sandbox, give_back

log = logging.getLogger(__name__)

OUTPUT_TAIL_BYTES = 64 * 1024
GUARD = Path(__file__).with_name("toolguard.py")
GUARD_KILL_S = 5.0  # a guard kills its tree in milliseconds; past this, SIGKILL the group
# The lifeline of every guard: a pipe whose write end only this process holds
# (non-inheritable, never closed). The kernel closes it when the worker dies,
# however it dies, and each guard reads that as "kill your tool".
_lifeline: tuple[int, int] | None = None


def lifeline() -> int:
    """The read end of the worker's lifeline, made on first use."""
    global _lifeline
    if _lifeline is None:
        _lifeline = os.pipe()
    return _lifeline[0]


def printable(raw: bytes) -> str:
    """A tool's output as text that can be stored: invalid UTF-8 and NUL
    (which PostgreSQL's jsonb cannot hold) as U+FFFD (issue 32: a NUL ended
    the run with a traceback)."""
    return raw.decode(errors="replace").replace("\0", "\ufffd")


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
    """Is any process of the group still running? Zombies do not count: the
    orphans of a killed guard are reparented to PID 1, which may reap them
    late (or never, in a container without an init), and waiting for a zombie
    to disappear would only spend the grace for nothing."""
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
    """SIGTERM to the process group, SIGKILL after grace_s; reaps the leader.

    The SIGKILL is the guard's to send (SIGUSR1): it reaches the descendants
    that left the group too. The group's SIGKILL follows as the fallback."""
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
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pgid, signal.SIGUSR1)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), GUARD_KILL_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    await proc.wait()


OnOutput = Callable[[str, bytes], None]
DISK_CHECK_S = 0.25  # how often the run's directory is measured while a tool runs
MAX_FILES = 100_000  # entries of a run's directory, besides its bytes


class ToolLimitExceeded(FatalError):
    """A tool went past a limit the worker enforces itself (the run's disk)."""


class ToolRefused(FatalError):
    """This worker may not run this run's tools (unsandboxed, another tenant's pool)."""


def disk_usage(path: Path, limit_bytes: int) -> int:
    """Bytes held under path (blocks, not sizes: a sparse file counts as
    written), stopping once over limit_bytes or MAX_FILES entries (then a
    number above the limit). A folder that cannot be listed counts as over:
    what cannot be measured is not allowed."""
    total, entries, stack = 0, 0, [str(path)]
    while stack:
        folder = stack.pop()
        try:
            it = os.scandir(folder)
        except PermissionError:
            give_back(folder)
            try:
                it = os.scandir(folder)
            except OSError:
                return limit_bytes + 1
        except OSError:
            continue
        try:
            with it:
                for entry in it:
                    entries += 1
                    if entries > MAX_FILES:
                        return limit_bytes + 1
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    if total > limit_bytes:
                        return total
        except OSError:
            continue
    return total


async def _tail(stream: asyncio.StreamReader | None, name: str = "",
                on_output: OnOutput | None = None) -> bytes:
    """Read a stream to its end, keeping only the last OUTPUT_TAIL_BYTES;
    on_output sees every chunk as it comes."""
    if stream is None:
        return b""
    kept = bytearray()
    while chunk := await stream.read(65536):
        if on_output is not None:
            on_output(name, chunk)
        kept += chunk
        if len(kept) > OUTPUT_TAIL_BYTES:
            del kept[: len(kept) - OUTPUT_TAIL_BYTES]
    return bytes(kept)


async def _status(fd: int) -> str:
    """All the guard writes on the status pipe: `exit <code>` or `exec <errno>`,
    or nothing if it was killed first."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    # Wraps the fd, no I/O; the transport owns the file and closes it.
    pipe = open(fd, "rb", buffering=0)  # noqa: ASYNC230, SIM115
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        return (await reader.read(256)).decode(errors="replace")
    finally:
        transport.close()


# The most of a tool's arguments a span shows (when the pool opts in).
TRACED_ARGUMENTS_CHARS = 1000


class ToolRunner:
    """Runs one run's tools; knows how hard to stop them.

    `grant` names the variables of the worker's environment the pool lets
    tools see; `run_env` (the run's id, attempt and lease epoch) is given to
    every tool."""

    def __init__(
        self,
        cancel: asyncio.Event,
        kill_grace_s: float,
        *,
        grant: frozenset[str] = frozenset(),
        run_env: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None,
        sandbox: Sandbox | None = None,
        run_name: str = "",
        refused: str | None = None,
        trace_arguments: bool = False,
    ) -> None:
        """`run_env` may be a function: made at the first tool (most runs
        have none, and a busy worker makes a ToolRunner per run). With a
        `sandbox`, each tool runs in it, in the run's directory `run_name`
        (made at the first tool, removed by close()). `refused` says why
        this run may not run tools here at all."""
        self.cancel = cancel
        self.kill_grace_s = kill_grace_s
        self.grant = toolenv.check_grant(grant) if grant else frozenset()
        self._run_env = run_env
        self.sandbox = sandbox
        self.run_name = run_name
        self.refused = refused
        self.trace_arguments = trace_arguments
        self._run_dir: Path | None = None
        self.hard = False  # lease lost or self-fenced: SIGKILL at once
        self.live: set[asyncio.subprocess.Process] = set()

    @property
    def holds_files(self) -> bool:
        """Whether a tool of this attempt made the run's directory (close removes it)."""
        return self._run_dir is not None and self.sandbox is not None

    def close(self) -> None:
        """The attempt has ended: the run's directory goes (its tools are gone)."""
        if self._run_dir is not None and self.sandbox is not None:
            self.sandbox.remove_run_dir(self.run_name)
            self._run_dir = None

    def _sandboxed(self, argv: Sequence[str], cwd: str | None,
                   env: dict[str, str]) -> tuple[list[str], str | None]:
        """argv as run in the sandbox, and the guard's working directory."""
        assert self.sandbox is not None
        if "/" not in argv[0] and shutil.which(argv[0], path=env.get("PATH")) is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
        if self._run_dir is None:
            self._run_dir = self.sandbox.run_dir(self.run_name or "run")
        env.update(HOME=INSIDE_WORK, TMPDIR=INSIDE_TMP)
        return self.sandbox.wrap(argv, self._run_dir, cwd=cwd), str(self._run_dir)

    async def _watch_disk(self, proc: asyncio.subprocess.Process, over: list[int]) -> None:
        """Kill the tool once the run's directory holds more than the limit."""
        assert self.sandbox is not None
        assert self._run_dir is not None
        limit = self.sandbox.limits.disk_mib * 1024 * 1024
        while True:
            used = await asyncio.to_thread(disk_usage, self._run_dir, limit)
            if used > limit:
                over.append(used)
                await terminate_group(proc, 0.0)
                return
            await asyncio.sleep(DISK_CHECK_S)

    @property
    def run_env(self) -> dict[str, str]:
        if not isinstance(self._run_env, dict):
            env = self._run_env() if callable(self._run_env) else self._run_env
            self._run_env = dict(env or {})
        return self._run_env

    def grace(self) -> float:
        return 0.0 if self.hard else self.kill_grace_s

    async def run(self, argv: Sequence[str], *, timeout_s: float | None = None,
                  cwd: str | None = None, env: Mapping[str, str] | None = None,
                  on_output: OnOutput | None = None) -> ToolResult:
        """on_output(stream name, chunk), if given, sees the output as it is
        printed (it must not block: it runs in the pipe readers)."""
        if not argv:
            raise ValueError("argv must not be empty")
        if self.refused is not None:
            raise ToolRefused(self.refused)
        started = time.monotonic()
        tool_env = toolenv.build(env, grant=self.grant, run_env=self.run_env)
        if tracing.ENABLED:
            return await self._traced(argv, tool_env, timeout_s, cwd, on_output, started)
        return await self._run(argv, tool_env, timeout_s, cwd, on_output, started)

    async def _traced(self, argv: Sequence[str], tool_env: dict[str, str],
                      timeout_s: float | None, cwd: str | None, on_output: OnOutput | None,
                      started: float) -> ToolResult:
        """_run inside a `tool` span: the command's name, its exit code and
        duration (its arguments, redacted and bounded, only when the pool
        opts in; never its output); the tool gets TRACEPARENT naming the
        span, so its own spans join the run's trace."""
        with tracing.span("tool", {"runlease.tool.command": os.path.basename(argv[0])[:200]}
                          ) as span:
            assert span is not None
            if self.trace_arguments:
                shown = logs.redact(json.dumps(list(argv), ensure_ascii=False))
                span.set_attribute("runlease.tool.arguments",
                                   shown[:TRACED_ARGUMENTS_CHARS])
            tool_env["TRACEPARENT"] = tracing.traceparent_of(span)
            result = await self._run(argv, tool_env, timeout_s, cwd, on_output, started)
            span.set_attributes({"runlease.tool.exit_code": result.returncode,
                                 "runlease.tool.duration_s": round(result.duration_s, 6)})
            if result.returncode != 0:
                span.set_status(tracing.error_status(f"exit code {result.returncode}"))
            return result

    async def _run(self, argv: Sequence[str], tool_env: dict[str, str],
                   timeout_s: float | None, cwd: str | None, on_output: OnOutput | None,
                   started: float) -> ToolResult:
        command: Sequence[str] = argv
        if self.sandbox is not None:
            command, cwd = self._sandboxed(argv, cwd, tool_env)
        guard_in = lifeline()
        status_r, status_w = os.pipe()
        try:
            # -I: the guard ignores PYTHON* variables the tool's env may carry.
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", str(GUARD), str(guard_in), str(status_w), *command,
                cwd=cwd, env=tool_env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True, pass_fds=(guard_in, status_w),
            )
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        self.live.add(proc)
        log.debug("tool_started pid=%s argv=%s", proc.pid, argv[0])
        output: asyncio.Future[Any] = asyncio.gather(_tail(proc.stdout, "stdout", on_output),
                                                     _tail(proc.stderr, "stderr", on_output),
                                                     _status(status_r))
        cancelled: asyncio.Future[Any] = asyncio.ensure_future(self.cancel.wait())
        over: list[int] = []
        watch = (asyncio.ensure_future(self._watch_disk(proc, over))
                 if self.sandbox is not None else None)
        try:
            done, _ = await asyncio.wait({output, cancelled}, timeout=timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if output in done:
                return await self._ended(proc, argv, output.result(), over, started)
            await asyncio.shield(self._stop(proc, output))
            if cancelled in done:
                raise RunCancelled(f"tool {argv[0]} stopped: the run was cancelled")
            raise ToolTimeout(f"tool {argv[0]} ran over its {timeout_s} s timeout")
        except asyncio.CancelledError:
            await asyncio.shield(self._stop(proc, output))
            raise
        finally:
            cancelled.cancel()
            if watch is not None:
                watch.cancel()
            self.live.discard(proc)

    async def _ended(self, proc: asyncio.subprocess.Process, argv: Sequence[str],
                     output: tuple[bytes, bytes, str], over: list[int],
                     started: float) -> ToolResult:
        """The tool's output is closed: its result, once nothing of it is left."""
        out, err, status = output
        word, *numbers = status.split() or [""]
        if word == "exec" or numbers[1:] == ["0"]:
            await proc.wait()  # nothing left: the guard is exiting
        else:
            # What the tool left running in its group (its output
            # closed) is stopped now; then the guard exits.
            await asyncio.shield(terminate_group(proc, self.grace()))
        if word == "exec":
            raise OSError(int(numbers[0]), os.strerror(int(numbers[0])), argv[0])
        if over:
            raise ToolLimitExceeded(
                f"tool {argv[0]} stopped: the run's directory went over its "
                f"{self.sandbox.limits.disk_mib if self.sandbox else 0} MiB")
        if word == "exit":
            code = int(numbers[0])
        else:  # no status: the guard itself was killed before the tool ended
            code = proc.returncode if proc.returncode else -signal.SIGKILL
        return ToolResult(tuple(argv), code, printable(out), printable(err),
                          time.monotonic() - started)

    async def _stop(self, proc: asyncio.subprocess.Process, output: asyncio.Future[Any]) -> None:
        await terminate_group(proc, self.grace())
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(output, 1.0)

    async def kill_all(self) -> None:
        await asyncio.gather(*(terminate_group(p, self.grace()) for p in list(self.live)),
                             return_exceptions=True)
