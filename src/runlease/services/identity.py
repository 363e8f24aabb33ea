"""Who a worker is: `<pod uid, else hostname>:<boot id>:<pid>`.

The pod UID (downward API) tells the operator which pod holds a lease; the
boot id and pid tell a restarted container, or a reused pid after a reboot,
from its predecessor.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    try:
        return BOOT_ID_PATH.read_text().strip() or "unknown-boot"
    except OSError:
        return "unknown-boot"


def worker_id(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    host = environ.get("POD_UID") or socket.gethostname()
    return f"{host}:{boot_id()}:{os.getpid()}"
