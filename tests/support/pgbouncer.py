"""A real PgBouncer in front of the test PostgreSQL. Its fixtures, in
pgbouncer_fixtures.py (a pytest plugin registered in tests/conftest.py), are
`pgbouncer` (the session's bouncer) and `bouncer_url` (the test's fresh
database, through it); this module imports no pytest, for bench/.

Debian's `pgbouncer` (scripts/install-tools installs it) runs in transaction
pooling mode, as production deployments behind it do: each transaction may
land on another server connection, so session state (prepared statements,
LISTEN, session advisory locks) does not survive between statements. One
wildcard entry routes every database name to the same-named database of the
server, so the per-test databases (tests/support/databases.py) need no
configuration. `auth_type = any` with a fixed server user: the embedded
server trusts local connections, and passwords are not what these tests test.

PgBouncer refuses to run as root: as root it is started with `-u` (it drops
to that user before opening its log), and its folder is that user's.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from psycopg import conninfo

from tests.support.pg import port_outside_the_ephemeral_range

# The server connections one database gets: small, so that a test's
# transactions really do move between client and server connections.
DEFAULT_POOL_SIZE = 8


def pgbouncer_binary() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None


def _run_as() -> str | None:
    """The user PgBouncer drops to when we are root (it refuses root): the
    embedded server's service user when it exists, otherwise nobody."""
    if os.geteuid() != 0:
        return None
    for name in ("runlease-pg", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("no user to run pgbouncer as (it refuses to run as root)")


class PgBouncer:
    """One pgbouncer process in front of `server_url`'s server."""

    def __init__(self, server_url: str, *, pool_mode: str = "transaction",
                 pool_size: int = DEFAULT_POOL_SIZE) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise FileNotFoundError(
                "pgbouncer is not installed: run scripts/install-tools, which installs "
                "Debian's `pgbouncer` package")
        self.binary = binary
        self.server = conninfo.conninfo_to_dict(server_url)
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, database_url: str) -> str:
        """database_url's database, through this bouncer."""
        params = conninfo.conninfo_to_dict(database_url)
        params.update(host="127.0.0.1", port=str(self.port))
        return conninfo.make_conninfo(**params)  # type: ignore[arg-type]

    def _config(self, folder: Path) -> str:
        host, port = self.server.get("host", "127.0.0.1"), self.server.get("port", "5432")
        user = self.server.get("user", "postgres")
        return "\n".join([
            "[databases]",
            f"* = host={host} port={port} user={user}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = any",
            f"pool_mode = {self.pool_mode}",
            f"default_pool_size = {self.pool_size}",
            "max_client_conn = 5000",
            # A server connection is checked (SELECT 1) before every reuse:
            # after a database restart (tests/support/chaos.py) a dead one is
            # dropped instead of handed to a client.
            "server_check_delay = 0",
            # After a failed server login PgBouncer refuses clients this long
            # (default 15 s) before it tries again: a database restart would
            # turn into 15 s of errors after the server is back.
            "server_login_retry = 1",
            "ignore_startup_parameters = extra_float_digits,options",
            f"logfile = {folder / 'pgbouncer.log'}",
            f"pidfile = {folder / 'pgbouncer.pid'}",
            "",
        ])

    def log(self) -> str:
        if self.dir is None or not (self.dir / "pgbouncer.log").exists():
            return ""
        return (self.dir / "pgbouncer.log").read_text(errors="replace")

    def start(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="runlease-pgbouncer-"))
        self.dir.chmod(0o755)
        user = _run_as()
        if user is not None:
            os.chown(self.dir, pwd.getpwnam(user).pw_uid, -1)
        self.port = port_outside_the_ephemeral_range()
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(self._config(self.dir))
        argv = [self.binary, *(["-u", user] if user else []), str(ini)]
        with (self.dir / "stderr.log").open("wb") as stderr:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr,
                                         start_new_session=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = (self.dir / "stderr.log").read_text(errors="replace")
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}):\n{err}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen on {self.port}:\n{self.log()}")

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)  # fast shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


@contextlib.contextmanager
def running_pgbouncer(server_url: str, **kwargs: object) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(server_url, **kwargs)  # type: ignore[arg-type]
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()
