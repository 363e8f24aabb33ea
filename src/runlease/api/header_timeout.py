"""A deadline on a request's headers (issue 32: there was none).

uvicorn times out an idle keep-alive connection, but not one that opens and
sends its request line and headers a byte at a time (slowloris): each such
connection is held for good, and enough of them exhaust the server's
sockets. This protocol gives the headers of each request `header_timeout_s`
from the connection (or from the first byte of the next request on a
kept-alive one); a request whose headers are not complete by then has its
connection closed. The body and the response are not limited here (an
event stream lasts as long as its run).
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)
DEFAULT_HEADER_TIMEOUT_S = 10.0


class HeaderTimeoutH11(H11Protocol):
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_watch()
        super().connection_lost(exc)

    def _watch_headers(self) -> None:
        """Armed while a request's headers are due, off once they are in."""
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(self.header_timeout_s,
                                                          self._headers_late)
        else:
            self._stop_watch()

    def _stop_watch(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.info("request_headers_timeout client=%s timeout_s=%s", self.client,
                     self.header_timeout_s)
            self.transport.close()


def with_header_timeout(timeout_s: float) -> type[HeaderTimeoutH11]:
    return type("HeaderTimeoutH11", (HeaderTimeoutH11,), {"header_timeout_s": timeout_s})
