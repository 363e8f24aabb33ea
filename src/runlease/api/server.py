"""Serving the API with uvicorn, stopping cleanly with streams open.

uvicorn waits for open connections before it shuts down; an event stream is
open for as long as its run lasts. So a stop (SIGTERM, or the owner's
request) first ends every stream, then lets uvicorn finish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator
from types import FrameType

import uvicorn
from fastapi import FastAPI

from runlease.api.deps import ApiState


class ApiServer(uvicorn.Server):
    def __init__(self, app: FastAPI, host: str, port: int, *, own_signals: bool = True) -> None:
        super().__init__(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                        lifespan="on", access_log=False))
        self.app_state: ApiState = app.state.runlease
        self.own_signals = own_signals

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
        hub = self.app_state.hub
        if hub is not None:
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().create_task(hub.close())

    def stop(self) -> None:
        self._end_streams()
        self.should_exit = True

    @property
    def port(self) -> int:
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self.config.port)
