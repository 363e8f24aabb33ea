"""Serving the API with uvicorn, stopping cleanly with streams open.

uvicorn waits for open connections before it shuts down; an event stream is
open for as long as its run lasts. So a stop (SIGTERM, or the owner's
request) first ends every stream, then lets uvicorn finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import socket
from collections.abc import Generator
from types import FrameType

import uvicorn
from fastapi import FastAPI

from runlease.api.deps import ApiState
from runlease.api.header_timeout import with_header_timeout
from runlease.errors import SettingsError

log = logging.getLogger(__name__)


def bind_socket(host: str, port: int, option: str = "--port (RUNLEASE_PORT)") -> socket.socket:
    """The listening socket, or one line that says what to change: uvicorn's
    own bind failure is a log line, then a traceback, then exit code 3."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise SettingsError(f"{option}: {host}:{port} is already in use; stop what "
                                f"listens there, or pick another port with --port") from None
        raise SettingsError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); "
                            f"check --host and {option}") from None


def run_forever(server: ApiServer) -> None:
    """Serve until stopped, on uvloop when it is installed (the submit path
    spends a good part of its time in the event loop)."""
    server.freeze_gc = True
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency, except on Windows
        asyncio.run(server.serve())
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(server.serve())


class ApiServer(uvicorn.Server):
    def __init__(self, app: FastAPI, host: str, port: int, *, own_signals: bool = True,
                 sock: socket.socket | None = None) -> None:
        # h11, even where httptools is installed: httptools answers a
        # malformed header with its own bare-text 400; h11 lets the app
        # answer in the API's error shape.
        # (With a deadline on each request's headers: api/header_timeout.py.)
        state: ApiState = app.state.runlease
        http = with_header_timeout(state.settings.request_header_timeout_s)
        super().__init__(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                        lifespan="on", access_log=False, http=http))
        self.app_state = state
        self.own_signals = own_signals
        self.sock = sock
        # Set by run_forever, whose process the server owns (not in tests,
        # where the process's other objects are not the server's to freeze).
        self.freeze_gc = False

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        if sockets is None:
            self.sock = self.sock or bind_socket(self.config.host, self.config.port)
            sockets = [self.sock]
        host, port = sockets[0].getsockname()[:2]
        log.info("api_listening url=http://%s:%s", f"[{host}]" if ":" in host else host, port)
        await super().serve(sockets=sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.freeze_gc:
            # Everything made while starting (the app, its routes and models,
            # imported modules) lives as long as the process: frozen, out of
            # the collector's sight, a full collection scans only what
            # requests made since. Unfrozen, one took 100-600 ms here (load
            # 6-19), stalling every request in flight: the list bench's
            # worst latencies.
            gc.freeze()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if self.own_signals:
            with super().capture_signals():
                yield
        else:  # the owner (runlease dev) handles signals and calls stop()
            yield

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._end_streams()
        super().handle_exit(sig, frame)

    def _end_streams(self) -> None:
        live = self.app_state.live
        if live is not None:
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().create_task(live.hub.close())

    def stop(self) -> None:
        self._end_streams()
        self.should_exit = True

    @property
    def port(self) -> int:
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self.config.port)
