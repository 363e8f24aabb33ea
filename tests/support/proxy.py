"""A TCP proxy that can cut the network between a worker and PostgreSQL.

`cut()` is a partition, not a refusal: established connections stay open
but no byte passes in either direction, and new connections are accepted and
left hanging — what a worker sees when its node loses the network.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class CuttableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port = int(self.listener.getsockname()[1])
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._run, name="cuttable-proxy", daemon=True)
        self._thread.start()

    def url_for(self, url: str) -> str:
        from psycopg import conninfo

        params = conninfo.conninfo_to_dict(url)
        params["host"], params["port"] = "127.0.0.1", str(self.port)
        return conninfo.make_conninfo(**params)  # type: ignore[arg-type]

    def cut(self) -> None:
        self._cut.set()

    def restore(self) -> None:
        """The network comes back: what was sent during the cut arrives now, late."""
        self._cut.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in [self.listener, *self._pairs, *self._held]:
            with contextlib.suppress(OSError):
                sock.close()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ)
        paused = False
        while not self._stop.is_set():
            if self._cut.is_set() != paused:
                # While cut, bytes wait unread in the kernel's buffers.
                paused = self._cut.is_set()
                for sock in self._pairs:
                    if paused:
                        sel.unregister(sock)
                    else:
                        sel.register(sock, selectors.EVENT_READ)
            for key, _ in sel.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.listener:
                    self._accept(sel)
                else:
                    self._relay(sel, sock)
        sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        try:
            client, _ = self.listener.accept()
        except BlockingIOError:
            return
        if self._cut.is_set():
            self._held.append(client)  # accepted, never answered
            return
        upstream = socket.create_connection(self.target)
        for a, b in ((client, upstream), (upstream, client)):
            a.setblocking(False)
            self._pairs[a] = b
            sel.register(a, selectors.EVENT_READ)

    def _relay(self, sel: selectors.BaseSelector, sock: socket.socket) -> None:
        peer = self._pairs.get(sock)
        if peer is None:
            return
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            for s in (sock, peer):
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(s)
                self._pairs.pop(s, None)
                s.close()
            return
        peer.setblocking(True)
        try:
            peer.sendall(data)
        except OSError:
            pass
        finally:
            peer.setblocking(False)
