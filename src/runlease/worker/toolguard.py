"""The guard of one tool process group: nothing of a tool outlives its worker.

    python -I -S toolguard.py <lifeline fd> <status fd> <argv...>

The worker starts this file (never imported: it runs on the standard library
alone, in a fresh interpreter that knows nothing of the worker) as the
leader of a new session, so the guard's pid is the tool's process group id
and the worker's group signals (SIGTERM, then SIGKILL after the grace) reach
the guard and the tool alike. The guard:

- forks the tool into its own group (the tool's direct child gets
  PR_SET_PDEATHSIG SIGKILL, should the guard alone be killed);
- is the child subreaper of everything the tool starts: an orphaned
  grandchild (`sleep 300 &` of a shell that exited) is reparented to the
  guard, not to PID 1, so the guard still holds it;
- blocks on the lifeline, a pipe whose only write end the worker holds; the
  kernel closes it when the worker dies by any means (kill -9, OOM), and the
  guard then SIGKILLs its whole group and every descendant, then itself;
- reports to the worker on the status pipe: `exec <errno>` when the tool
  cannot be started, `exit <code> <left>` when the tool's main process ended
  (code negative: killed by that signal; left 1 if any of its descendants
  still runs, which the worker then stops);
- survives the worker's group SIGTERM (which is for the tool), passing it on
  to descendants that left the group, and stays until every descendant has
  ended, reaping them; it exits 0 once it reported the tool's code;
- on SIGUSR1, the worker's "kill it all" (what a stop does after the grace,
  or at once when the lease is lost), SIGKILLs the group and every
  descendant, then itself: a SIGKILL of the group alone would kill the guard
  and leave a descendant that left the group (setsid) running.

A PR_SET_PDEATHSIG on the guard would only tell it that the worker *thread*
that started it ended; the lifeline tells it that the worker process is gone.
"""

import contextlib
import ctypes
import errno
import os
import select
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
KILL_ROUNDS = 1000  # each round kills what the last one's deaths reparented to us


def prctl(option: int, value: int) -> bool:
    """prctl(2); False where there is none (not Linux): the guard then still
    kills its group when the worker dies, but cannot hold what leaves it."""
    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _tool_environ() -> dict[bytes, bytes]:
    """The environment the worker gave, exactly: Python itself may have added
    to os.environ at start (LC_CTYPE, when it coerces a C locale)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return dict(os.environb)
    return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)


def _write(fd: int, text: str) -> None:
    with contextlib.suppress(OSError):  # the worker is gone: the lifeline will say so
        os.write(fd, text.encode())


def _start(argv: list[str], guard: int) -> tuple[int, int]:
    """Fork and exec the tool; (pid, errno of a failed exec or 0)."""
    env = _tool_environ()
    err_r, err_w = os.pipe()  # close-on-exec: EOF alone means the exec worked
    pid = os.fork()
    if pid == 0:  # the tool, until exec
        try:
            os.close(err_r)
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != guard:  # the guard died before the line above
                os._exit(137)
            # Python ignores these, and an ignored signal stays ignored across
            # exec (the guard's own handlers are reset by exec itself).
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(err_w, str(exc.errno or errno.ENOEXEC).encode())
        finally:
            os._exit(127)
    os.close(err_w)
    raw = b""
    while chunk := os.read(err_r, 64):
        raw += chunk
    os.close(err_r)
    return pid, int(raw) if raw else 0


def _tree(guard: int) -> list[tuple[int, int]]:
    """(pid, process group) of every live process of the guard's group and
    every descendant of the guard, the guard left out: one that moved to a
    group or session of its own (setsid) is still a descendant."""
    stats: dict[int, tuple[int, int]] = {}  # pid -> (ppid, pgrp)
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: the group kill is all there is
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            stats[int(name)] = (int(fields[1]), int(fields[2]))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found = {pid for pid, (_, pgrp) in stats.items() if pgrp == guard}
    stack = [guard]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    found.discard(guard)
    return [(pid, stats[pid][1]) for pid in found if pid in stats]


def _kill_everything(guard: int) -> None:
    """SIGKILL the group and every descendant, then the guard itself: when the
    worker is gone, or when it asks (SIGUSR1) instead of killing the group."""
    for _ in range(KILL_ROUNDS):
        victims = _tree(guard)
        if not victims:
            break
        for pid, _ in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap(None, -1)
    os.killpg(guard, signal.SIGKILL)


def _terminate_escaped(guard: int) -> None:
    """The worker's SIGTERM reached the group: pass it to the descendants that
    left the group, so a stop gives them the same grace."""
    for pid, pgrp in _tree(guard):
        if pgrp != guard:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def _reap(tool: int | None, status: int) -> tuple[bool, int | None]:
    """Reap every child that has ended: (any child left, the tool's exit code
    if it was among them). The tool's code is reported on the status pipe with
    whether anything of it is left: the worker stops the rest only then."""
    code = None
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            left = False
            break
        if pid == 0:
            left = True
            break
        if pid == tool:
            code = os.waitstatus_to_exitcode(wait_status)
    if code is not None:
        _write(status, f"exit {code} {int(left)}\n")
        os.close(status)
    return left, code


def main(args: list[str]) -> int:
    lifeline, status = int(args[0]), int(args[1])
    argv = args[2:]
    guard = os.getpid()
    os.set_inheritable(lifeline, False)
    os.set_inheritable(status, False)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    # The tool runs as the guard's user: non-dumpable, the guard's /proc/<pid>/fd
    # (the status pipe: a forged "exit") and memory are closed to it. exec
    # makes the tool dumpable again.
    prctl(PR_SET_DUMPABLE, 0)
    # Handlers, not SIG_IGN: the tool gets SIG_DFL back at exec.
    signal.signal(signal.SIGTERM, lambda *_: _terminate_escaped(guard))
    signal.signal(signal.SIGUSR1, lambda *_: _kill_everything(guard))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    poller = select.poll()
    poller.register(lifeline, select.POLLIN | select.POLLHUP | select.POLLERR)
    poller.register(wake_r, select.POLLIN)
    # The tool inherits fds 0-2 as the worker gave them; then the guard lets
    # go of the output pipes: holding them would keep the worker reading
    # until the guard, not the tool, is done.
    tool, failed = _start(argv, guard)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    if failed:
        _write(status, f"exec {failed}\n")
        os.close(status)
        _reap(None, -1)
        return 127
    reported = False
    while True:
        left, code = _reap(None if reported else tool, status)
        reported = reported or code is not None
        if not left:
            return 0
        for fd, _ in poller.poll():
            if fd == lifeline:
                _kill_everything(guard)
                return 137
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
