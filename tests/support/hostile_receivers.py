"""Webhook receivers a hostile tenant would run, in a process of their own
(`python -m tests.support.hostile_receivers`; prints their ports as JSON):

    drip   reads the request, then answers one byte every 0.5 s, forever
           (no single read ever waits long: a per-read timeout never fires)
    huge   answers 200 with a 300 MB body, written as fast as it is read
    bomb   answers 200, Content-Encoding gzip: 200 KB that inflate to 200 MB
    ok     answers 200 at once
"""

from __future__ import annotations

import asyncio
import json
import sys
import zlib

HUGE_BYTES = 300 * 1024 * 1024
CHUNK = b"\0" * 65536


def _bomb() -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    parts = [packer.compress(CHUNK) for _ in range(200 * 16)]
    parts.append(packer.flush())
    return b"".join(parts)


BOMB = _bomb()


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)


def handler(kind: str):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await _read_request(reader)
            if kind == "drip":
                for byte in b"HTTP/1.1 200 OK\r\nX-Drip: " + b"x" * 10_000_000:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.5)
            elif kind == "huge":
                writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {HUGE_BYTES}\r\n\r\n".encode())
                for _ in range(HUGE_BYTES // len(CHUNK)):
                    writer.write(CHUNK)
                    await writer.drain()
            elif kind == "bomb":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
                             + f"Content-Length: {len(BOMB)}\r\n\r\n".encode() + BOMB)
                await writer.drain()
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
    return handle


async def main() -> None:
    ports = {}
    servers = []
    for kind in ("drip", "huge", "bomb", "ok"):
        server = await asyncio.start_server(handler(kind), "127.0.0.1", 0)
        servers.append(server)
        ports[kind] = server.sockets[0].getsockname()[1]
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
