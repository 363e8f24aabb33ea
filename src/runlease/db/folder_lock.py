"""Who owns an embedded PostgreSQL's data folder: one process at a time.

`runlease dev` (and `runlease migrate` without a URL) start the server in a
folder and stop it when they end. A second one in the same folder used to
reuse the first one's server and stop it on its way out, leaving the first
stack on a dead database. So the folder has an owner: an exclusive `flock`
on `<folder>/owner.lock`, which the kernel drops when the owner exits (even
under kill -9, so a stale lock never blocks anyone), and in the file who
holds it (pid, what for) so that the one refused can say whom to stop.

A server found running in a folder whose lock was free was left by an owner
that died without stopping it (kill -9): nobody else can be using it through
this folder, so the new owner adopts it and stops it when done.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from runlease.errors import RunleaseError

LOCK_FILE = "owner.lock"


class FolderBusy(RunleaseError):
    """Another live process owns the folder."""

    def __init__(self, folder: Path, owner: dict[str, Any]) -> None:
        self.folder, self.owner = folder, owner
        who = f"pid {owner.get('pid', '?')}"
        if owner.get("api"):
            who += f", API {owner['api']}"
        what = owner.get("command") or "another runlease process"
        super().__init__(
            f"{folder}/ is in use by {what} ({who}): a second one here would share its "
            "PostgreSQL, which the first stops when it ends; stop that one first, or give "
            "this one a folder of its own (--data-dir)"
        )


class FolderLock:
    """`with FolderLock(folder, command="runlease dev"):` owns the folder
    for the block, or raises FolderBusy at once (it never waits)."""

    def __init__(self, folder: Path, *, command: str) -> None:
        self.folder = Path(folder).absolute()
        self.path = self.folder / LOCK_FILE
        self.command = command
        self._fd: int | None = None

    def acquire(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read(fd)
            os.close(fd)
            raise FolderBusy(self.folder, owner) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.describe()

    def describe(self, **more: Any) -> None:
        """Write who owns the folder (and `more`: the API's URL, once known)."""
        if self._fd is None:
            return
        body = json.dumps({"pid": os.getpid(), "command": self.command, **more}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, body, 0)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read(fd: int) -> dict[str, Any]:
    """The owner as its file says, only what fits a one-line message: anyone
    who can write the folder can write the file."""
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    if not isinstance(owner, dict):
        return {}
    shown: dict[str, Any] = {}
    if isinstance(owner.get("pid"), int):
        shown["pid"] = owner["pid"]
    for key in ("command", "api"):
        value = owner.get(key)
        if isinstance(value, str) and value.isprintable() and len(value) <= 200:
            shown[key] = value
    return shown
