"""The built image and the engine that runs it (podman or docker).

scripts/build-image writes .runlease/image.env (the image, the engine holding
it, its base); RUNLEASE_IMAGE, RUNLEASE_IMAGE_ENGINE and RUNLEASE_BASE_IMAGE
in the environment override it. No image configured: the tests skip, except
under CI=true, where .ci/run builds one first and its absence is a failure.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV_FILE = ROOT / ".runlease" / "image.env"
KEYS = ("RUNLEASE_IMAGE", "RUNLEASE_IMAGE_ENGINE", "RUNLEASE_BASE_IMAGE")

# The chart's securityContext (values.yaml) and the operator's worker pods:
# no capability, no privilege escalation, a read-only root filesystem with an
# emptyDir on /tmp (here a tmpfs), the image's own non-root USER; and the
# host's network, so the containers reach the test's PostgreSQL on 127.0.0.1.
HARDENED = ("--network", "host", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges")


def configured() -> dict[str, str]:
    found: dict[str, str] = {}
    if ENV_FILE.exists():
        for line in ENV_FILE.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() in KEYS and value.strip():
                found[key.strip()] = value.strip()
    found.update({k: os.environ[k] for k in KEYS if os.environ.get(k)})
    return found


def _ulimits() -> list[str]:
    """podman's default ulimits can exceed what this machine lets a process
    set, and the container then fails to start (runc: "error setting
    rlimit"): ask for the hard limits, and no more processes than pid_max
    (a sandbox here refuses an nproc above it)."""
    out = []
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(limit)[1]
        if name == "nproc":
            hard = pid_max if hard == resource.RLIM_INFINITY else min(hard, pid_max)
        if hard != resource.RLIM_INFINITY:
            out += ["--ulimit", f"{name}={hard}:{hard}"]
    return out


@dataclass(frozen=True)
class Engine:
    command: str  # podman or docker
    image: str
    base: str | None

    @classmethod
    def from_config(cls, config: dict[str, str]) -> Engine:
        command = config.get("RUNLEASE_IMAGE_ENGINE") or (
            "podman" if shutil.which("podman") else "docker")
        return cls(command, config["RUNLEASE_IMAGE"], config.get("RUNLEASE_BASE_IMAGE"))

    def _argv(self, args: Sequence[str]) -> list[str]:
        argv = [self.command]
        # runc: podman's default runtime (crun) fails on some hosts' cgroups.
        if self.command == "podman" and shutil.which("runc"):
            argv += ["--runtime", "runc"]
        if args and args[0] == "run" and self.command == "podman":
            # Without this podman adds tmpfs mounts of its own (/var/tmp, /run)
            # to a --read-only container; a pod has only its /tmp emptyDir.
            return [*argv, "run", "--read-only-tmpfs=false", *_ulimits(), *args[1:]]
        argv += list(args)
        return argv

    def __call__(self, *args: str, check: bool = True,
                 timeout: float = 180) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(self._argv(args), capture_output=True, text=True,
                                timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise AssertionError(f"{self.command} {' '.join(args)} exited "
                                 f"{result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def sandbox_options(self) -> list[str]:
        """What the operator gives a sandboxed pool's worker pods (seccomp
        Unconfined, procMount Unmasked): bwrap's unshare(2) and a fresh /proc
        in the container (docs/security.md, Tools)."""
        unmask = "unmask=/proc/*" if self.command == "podman" else "systempaths=unconfined"
        return ["--security-opt", "seccomp=unconfined", "--security-opt", unmask]

    def run(self, *args: str, options: Sequence[str] = (), image: str | None = None,
            entrypoint: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """A one-off container, hardened as the chart's, removed when it exits."""
        head = ["run", "--rm", *HARDENED, *options]
        if entrypoint is not None:
            head += ["--entrypoint", entrypoint]
        return self(*head, image or self.image, *args, check=check)

    def inspect(self, name: str, template: str) -> str:
        return self("inspect", "--format", template, name).stdout.strip()

    @contextlib.contextmanager
    def container(self, name: str, *options: str, args: Sequence[str]) -> Iterator[str]:
        """A detached container, hardened as the chart's; removed at the end."""
        self("rm", "-f", name, check=False)
        self("run", "-d", "--name", name, *HARDENED, *options, self.image, *args)
        try:
            yield name
        finally:
            self("rm", "-f", name, check=False)

    def logs(self, name: str) -> str:
        result = self("logs", name, check=False)
        return result.stdout + result.stderr
