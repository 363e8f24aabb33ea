"""The sandbox of one tool call: bubblewrap, new namespaces, limits, a run's own files.

A tool is a command a model chose, run for a tenant. Tenants share workers,
so a tool must not reach the worker or another run's tools:

    namespaces   new user, PID, IPC, UTS and mount namespaces (and network
                 when the pool says so): a fresh /proc shows the tool its own
                 processes only, so it can neither read another run's
                 /proc/<pid>/environ nor signal the worker or another run
    files        / read-only; a fresh /dev; tmpfs over /tmp, /var/tmp, /run
                 (the secrets Kubernetes mounts under /var/run/secrets), /home,
                 /root, the worker's HOME and every run's directory, and over
                 whatever the pool adds (`hide_paths`); then the run's own
                 directory, read-write, at /work (HOME and the working
                 directory) and a tmpfs of `disk_mib` at /tmp (TMPDIR)
    limits       processes, address space, CPU seconds and file size
                 (setrlimit through prlimit(1), inside the user namespace,
                 where the process count is the sandbox's own); the run's
                 directory is measured while its tools run (worker/tools.py)
    lifetime     bwrap's PID 1 holds the tool: when the tool's main process
                 exits, the kernel kills every process of the namespace (a
                 setsid daemon too); --die-with-parent, the guard's lifeline
                 and SIGKILL of the group cover the step's end, a cancel and
                 the worker's death

A worker running as root starts bwrap as `uid` (65534, nobody, by default):
root in a user namespace would still own the files root owns outside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runlease.settings import WorkerSettings

log = logging.getLogger(__name__)

INSIDE_WORK = "/work"
INSIDE_TMP = "/tmp"  # inside the sandbox: its own tmpfs
# Hidden behind an empty tmpfs in every sandbox (those that exist).
HIDDEN = ("/tmp", "/var/tmp", "/run", "/var/run", "/home", "/root", "/dev/shm", "/mnt",
          "/media", "/srv")
MIB = 1024 * 1024
SHM_MIB = 64


class SandboxUnavailable(RuntimeError):
    """bwrap is missing or cannot make its namespaces here."""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """What one tool call may use; the defaults are the pool's when it sets none."""

    max_processes: int = 256
    memory_mib: int = 1024  # address space of each process (RLIMIT_AS)
    cpu_s: int = 600  # CPU seconds of each process (RLIMIT_CPU)
    file_size_mib: int = 256  # largest file a process may write (RLIMIT_FSIZE)
    disk_mib: int = 512  # the sandbox's /tmp (a tmpfs) and the run's directory, each
    network: bool = True
    hide_paths: tuple[str, ...] = ()  # directories (a tmpfs over each) or files (/dev/null)


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How a worker's tools are sandboxed: the limits and where runs' files go."""

    limits: SandboxLimits
    runs_dir: Path  # every worker's runs' directories are under it, hidden from tools
    bwrap: str = "bwrap"
    prlimit: str = "prlimit"
    setpriv: str = "setpriv"
    uid: int = 65534  # who a root worker's tools run as
    worker_dir: str = ""  # this worker's own, under runs_dir: w<pid>
    drops_root: bool = False  # a root worker: its tools run as `uid`

    def run_dir(self, name: str) -> Path:
        """The directory of one run (made on its first tool call, empty)."""
        path = self.runs_dir / self.worker_dir / name
        path.mkdir(mode=0o700, exist_ok=True)
        if self.drops_root:
            os.chown(path, self.uid, self.uid)
        return path

    def remove_run_dir(self, name: str) -> None:
        remove_tree(self.runs_dir / self.worker_dir / name)

    def wrap(self, argv: Sequence[str], run_dir: Path, *, cwd: str | None = None) -> list[str]:
        """The command line that runs argv in this sandbox. `cwd` (the agent's
        choice, not the tool's) is made visible read-write at its own path."""
        lim = self.limits
        outer: list[str] = []
        if self.drops_root:
            outer = [self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}",
                     "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
        opts = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--hostname", "sandbox"]
        if not lim.network:
            opts.append("--unshare-net")
        opts += [*_root(), "--proc", "/proc", "--dev", "/dev"]
        hidden = [*HIDDEN, *lim.hide_paths, str(self.runs_dir)]
        home = os.environ.get("HOME")
        if home and home != "/":
            hidden.append(home)
        for path in dict.fromkeys(hidden):
            # A symlink (/var/run -> /run) is hidden through its target. Each
            # tmpfs is small: it hides, it is not a place to store things.
            if os.path.isdir(path) and not os.path.islink(path):
                opts += ["--size", str(SHM_MIB * MIB if path == "/dev/shm" else MIB),
                         "--tmpfs", path]
            elif os.path.isfile(path) and not os.path.islink(path):
                opts += ["--ro-bind", "/dev/null", path]
        opts += ["--size", str(lim.disk_mib * MIB), "--tmpfs", INSIDE_TMP,
                 "--bind", str(run_dir), INSIDE_WORK]
        inside_cwd = INSIDE_WORK
        if cwd is not None:
            if os.path.isabs(cwd):
                opts += ["--bind", cwd, cwd]
                inside_cwd = cwd
            else:
                inside_cwd = os.path.join(INSIDE_WORK, cwd)
        # bwrap's own root (a tmpfs, where /work was made) read-only from now on.
        opts += ["--remount-ro", "/", "--chdir", inside_cwd]
        # CPU: SIGXCPU at the limit (exit 152: says why), SIGKILL a second later.
        limits = [self.prlimit, f"--nproc={lim.max_processes}",
                  f"--as={lim.memory_mib * MIB}", f"--cpu={lim.cpu_s}:{lim.cpu_s + 1}",
                  f"--fsize={lim.file_size_mib * MIB}", "--"]
        return [*outer, self.bwrap, *opts, "--", *limits, *argv]


CAP_CHOWN, CAP_SETGID, CAP_SETUID = 0, 6, 7


def can_switch_user() -> bool:
    """Root with the capabilities to hand a directory and the tools to
    another uid. (A root without them cannot map itself into a user
    namespace either: its sandbox does not start, and it says so.)"""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    return all(caps >> bit & 1 for bit in (CAP_CHOWN, CAP_SETGID, CAP_SETUID))


def give_back(folder: str) -> None:
    """A tool (of the worker's own uid, in its user namespace) may take the
    read or search bit off a folder of its run's directory, to hide what it
    writes there: the worker, its owner, gives it back."""
    # Through a descriptor opened without following a symlink: a tool that
    # swaps the folder for a link to another file must not get it chmod-ed.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)


def remove_tree(path: Path) -> None:
    """rmtree that gives back what a tool took first; never follows a symlink."""
    def retry(func: Callable[[str], object], failed: str, _: object) -> None:
        for folder in (os.path.dirname(failed), failed):
            give_back(folder)
        with contextlib.suppress(OSError):
            func(failed)

    shutil.rmtree(path, onerror=retry)


def _root() -> list[str]:
    """The host's / read-only, entry by entry, on bwrap's own root: a bind of
    / itself would leave no place for /work where / has none (a read-only
    root filesystem, as in a worker pod)."""
    out: list[str] = []
    for entry in sorted(os.scandir("/"), key=lambda e: e.name):
        path = "/" + entry.name
        if entry.name in ("proc", "dev"):
            continue
        if entry.is_symlink():  # /bin -> usr/bin
            out += ["--symlink", os.readlink(path), path]
        else:
            out += ["--ro-bind", path, path]
    return out


def default_runs_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"runlease-runs-{os.geteuid()}"


def make(limits: SandboxLimits, runs_dir: str = "", uid: int = 65534) -> Sandbox:
    """A Sandbox whose tools (bwrap, prlimit, setpriv) were found and which
    works here: a tool call made with it starts. Raises SandboxUnavailable."""
    found = {name: shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/bin")
             for name in ("bwrap", "prlimit", "setpriv")}
    missing = [name for name, path in found.items() if path is None
               and (name != "setpriv" or can_switch_user())]
    if missing:
        raise SandboxUnavailable(
            f"{', '.join(missing)} not found: install Debian's bubblewrap and util-linux "
            "packages (the image has them)")
    base = Path(runs_dir) if runs_dir else default_runs_dir()
    box = Sandbox(limits, base, bwrap=found["bwrap"] or "bwrap",
                  prlimit=found["prlimit"] or "prlimit", setpriv=found["setpriv"] or "setpriv",
                  uid=uid, worker_dir=f"w{os.getpid()}",
                  drops_root=uid != 0 and can_switch_user())
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        if base.is_symlink() or base.stat().st_uid != os.geteuid():
            raise SandboxUnavailable(f"{base} is not this user's own directory")
        # The tools' uid must reach its run's directory (and list no other).
        os.chmod(base, 0o711 if box.drops_root else 0o700)
        closed = [p for p in base.parents if box.drops_root and not p.stat().st_mode & 0o001]
        if closed:
            raise SandboxUnavailable(
                f"{closed[0]} is not traversable by others, so the tools' uid {uid} cannot "
                f"reach their directories in {base}; choose --tool-runs-dir elsewhere")
        mine = base / box.worker_dir
        mine.mkdir(mode=0o700, exist_ok=True)
        os.chmod(mine, 0o711 if box.drops_root else 0o700)
        _sweep(base, mine)
        _probe(box)
    except OSError as exc:
        raise SandboxUnavailable(f"{base}: {exc}") from None
    return box


def _sweep(base: Path, mine: Path) -> None:
    """Remove what workers killed before they could clean up left (their
    runs' directories), those of live workers sharing the place kept."""
    for entry in base.iterdir():
        if entry == mine or not entry.name.startswith("w") or not entry.name[1:].isdigit():
            continue
        try:
            os.kill(int(entry.name[1:]), 0)
        except ProcessLookupError:
            remove_tree(entry)
        except PermissionError:
            pass  # alive, another user's


_probed: set[Sandbox] = set()


def _probe(box: Sandbox) -> None:
    """Run `true` in the sandbox once per process and configuration."""
    if box in _probed:
        return
    name = f".probe-{os.getpid()}"
    run_dir = box.run_dir(name)
    try:
        done = subprocess.run(box.wrap(["true"], run_dir), capture_output=True, text=True,
                              timeout=30, check=False, stdin=subprocess.DEVNULL,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"bwrap did not start: {exc}") from None
    finally:
        box.remove_run_dir(name)
    if done.returncode != 0 and os.geteuid() == 0 and not box.drops_root:
        raise SandboxUnavailable(
            f"bwrap cannot start ({done.stderr.strip()[-200:]}): root without CAP_SETUID "
            "cannot map itself into a user namespace; run the worker as a non-root uid "
            "(the image's 10001), or as root with its capabilities")
    if done.returncode != 0:
        raise SandboxUnavailable(
            f"bwrap cannot make its namespaces here (exit {done.returncode}: "
            f"{done.stderr.strip()[-300:]}); the kernel must allow unprivileged user "
            "namespaces and the container's seccomp profile unshare(2) "
            "(docs/security.md, 'Tools')")
    _probed.add(box)
    log.info("tool_sandbox_ready bwrap=%s runs_dir=%s", box.bwrap, box.runs_dir)


def from_settings(s: WorkerSettings) -> Sandbox | None:
    """The worker's sandbox, or None with --no-tool-sandbox. Raises SandboxUnavailable."""
    if not s.tool_sandbox:
        return None
    limits = SandboxLimits(
        max_processes=s.tool_max_processes, memory_mib=s.tool_memory_mib, cpu_s=s.tool_cpu_s,
        file_size_mib=s.tool_file_size_mib, disk_mib=s.tool_disk_mib, network=s.tool_network,
        # The file of the worker's database URL too, wherever it is mounted.
        hide_paths=(*s.tool_hide_paths,
                    *((os.path.abspath(s.database_url_file),) if s.database_url_file else ())))
    return make(limits, s.tool_runs_dir, s.tool_uid)
