"""A small HTTP endpoint for probes and scraping: /metrics, /healthz, /readyz.

Workers and the operator serve only these three paths, so a few lines of
asyncio do; no web framework in the worker image's hot process.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from runlease.errors import SettingsError

log = logging.getLogger(__name__)

Check = Callable[[], "tuple[bool, str] | Awaitable[tuple[bool, str]]"]


class ProbeServer:
    def __init__(self, host: str, port: int, *, health: Check, ready: Check) -> None:
        self.host = host
        self.port = port
        self.checks = {"/healthz": health, "/readyz": ready}
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
        except OSError as exc:
            # One line naming the setting, not a traceback (both processes
            # call it --metrics-port).
            taken = " is already in use" if exc.errno == errno.EADDRINUSE else f": {exc}"
            raise SettingsError(f"--metrics-port (RUNLEASE_METRICS_PORT): {self.host}:"
                                f"{self.port}{taken}; pick another, or 0 to turn "
                                "/metrics off") from None
        sock = self._server.sockets[0].getsockname()
        self.port = int(sock[1])
        log.info("probe_server_listening host=%s port=%s", self.host, self.port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while (line := await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n",
                                                                                  b""):
                del line  # headers are not needed
            parts = request.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            status, ctype, body = await self._route(parts[0] if parts else "", path)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _route(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"method not allowed\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest()
        check = self.checks.get(path)
        if check is None:
            return "404 Not Found", "text/plain", b"not found\n"
        try:
            outcome = check()
            ok, detail = await outcome if inspect.isawaitable(outcome) else outcome
        except Exception as exc:  # a failing check is an unhealthy answer
            ok, detail = False, f"check failed: {exc}"
        return ("200 OK" if ok else "503 Service Unavailable", "text/plain",
                (detail + "\n").encode())
