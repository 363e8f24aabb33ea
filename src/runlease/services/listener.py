"""LISTEN on its own session-mode connection, with reconnects.

NOTIFY is not durable, and a LISTEN session misses everything while it is
down; so after every (re)connect `on_connect` runs, letting its owner poll
for what it may have missed, and `on_disconnect` when the session is lost
(an owner that polls only while it is down). Payloads are ids only; the
table is the truth.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import psycopg
from psycopg import sql

from runlease.db.connect import Conn, connect
from runlease.services.loop import Service, jittered, sleep

log = logging.getLogger(__name__)

Handler = Callable[[str], None]


class Listener(Service):
    name = "listener"
    cancel_on_stop = True

    def __init__(
        self,
        url: str,
        handlers: Mapping[str, Handler],
        *,
        on_connect: Callable[[], None] | None = None,
        on_disconnect: Callable[[], None] | None = None,
        backoff_max_s: float = 5.0,
        probe_s: float = 5.0,
        application_name: str = "runlease-listen",
    ) -> None:
        super().__init__()
        self.url = url
        self.handlers = dict(handlers)
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self.backoff_max_s = backoff_max_s
        self.probe_s = probe_s
        self.application_name = application_name

    async def _main(self) -> None:
        delay = 0.05
        while not self.stopping.is_set():
            try:
                async with await connect(self.url, prepare=False,
                                         application_name=self.application_name) as conn:
                    for channel in self.handlers:
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    delay = 0.05
                    log.info("listener_connected channels=%s", ",".join(self.handlers))
                    try:
                        if self.on_connect:
                            self.on_connect()
                        await self._dispatch(conn)
                    finally:
                        if self.on_disconnect:
                            self.on_disconnect()
            except asyncio.CancelledError:
                raise
            except psycopg.Error as exc:
                if self.stopping.is_set():
                    break
                log.warning("listener_disconnected error=%s retry_in_s=%.2f",
                            str(exc).strip() or type(exc).__name__, delay)
            if await sleep(jittered(delay, 0.5), self.stopping):
                break
            delay = min(self.backoff_max_s, delay * 2)

    async def _dispatch(self, conn: Conn) -> None:
        # notifies() with a timeout returns now and then, so stop() is seen
        # and an idle session is probed: a cut network shows up as an error
        # here (with TCP keepalives and tcp_user_timeout set on the URL).
        while not self.stopping.is_set():
            async for notify in conn.notifies(timeout=self.probe_s):
                handler = self.handlers.get(notify.channel)
                if handler is None:
                    continue
                try:
                    handler(notify.payload)
                except Exception:
                    log.exception("listener_handler_failed channel=%s", notify.channel)
            if not self.stopping.is_set():
                await conn.execute("SELECT 1")
