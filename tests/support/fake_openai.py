"""A scripted Chat Completions server on 127.0.0.1 for the openai agent's tests.

    async with FakeOpenAI() as server:
        server.script(Reply(tool_calls=[ToolCall("call_1", "shell", {"argv": ["true"]})]),
                      Reply(content="done"))
        ...  # point RUNLEASE_OPENAI_BASE_URL at server.base_url
        server.requests[1].body["messages"]  # what the agent sent back

Each POST /v1/chat/completions takes the next scripted Reply (an HTTP 500
when the script is used up) and answers the way OpenAI streams: a role
chunk, content in small pieces, each tool call as a first fragment with its
id and name followed by its arguments in several fragments, a chunk with the
finish_reason, then `data: [DONE]`, all in chunked transfer encoding. A
Reply can instead refuse (status, error), fail where the finish_reason would
have come (`fail="drop"` cuts the connection, `fail="error"` sends an error
event, `fail="end"` ends the body cleanly but early) or stream slowly
(`delay_s` between chunks). It runs on the test's own event loop, like the
in-process worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    content: str = ""
    tool_calls: Sequence[ToolCall] = ()
    status: int = 200
    error: str = "scripted failure"  # the error body's message when status >= 400
    echo_key: bool = False  # append the bearer token received to the error message
    fail: Literal["drop", "error", "end"] | None = None
    delay_s: float = 0.0
    chunk_chars: int = 4
    plain: bool = False  # ignore `stream: true`: one application/json completion
    usage: dict[str, Any] | None = None  # sent when asked for (stream_options.include_usage)


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    at: float


@dataclass
class FakeOpenAI:
    replies: list[Reply] = field(default_factory=list)
    requests: list[Received] = field(default_factory=list)
    # monotonic instants at which a client went away before its stream ended
    hangups: list[float] = field(default_factory=list)
    _server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    @property
    def base_url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    # -- HTTP --------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            request_line, *lines = head.split("\r\n")
            _, path, _ = request_line.split(" ", 2)
            headers = {k.strip().lower(): v.strip()
                       for k, _, v in (line.partition(":") for line in lines if line)}
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            body = json.loads(raw) if raw else None
            self.requests.append(Received(path, headers, body, time.monotonic()))
            if path != "/v1/chat/completions":
                reply = Reply(status=404, error=f"no route {path}")
            elif self.replies:
                reply = self.replies.pop(0)
            else:
                reply = Reply(status=500, error="the fake server's script is used up")
            await self._answer(reader, writer, reply, headers, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.hangups.append(time.monotonic())
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      reply: Reply, headers: dict[str, str], body: Any) -> None:
        if reply.status >= 400:
            message = reply.error
            if reply.echo_key:
                token = headers.get("authorization", "").removeprefix("Bearer ")
                message += f" (you sent: {token})"
            payload = json.dumps({"error": {"message": message, "type": "fake_error"}}).encode()
            writer.write(self._status_line(reply.status) + b"Content-Type: application/json\r\n"
                         + f"Content-Length: {len(payload)}\r\n".encode()
                         + b"Connection: close\r\n\r\n" + payload)
            await writer.drain()
            return
        if reply.plain:
            payload = json.dumps(self._completion(reply)).encode()
            writer.write(self._status_line(200) + b"Content-Type: application/json\r\n"
                         + f"Content-Length: {len(payload)}\r\n".encode()
                         + b"Connection: close\r\n\r\n" + payload)
            await writer.drain()
            return
        writer.write(self._status_line(200) + b"Content-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        model = body.get("model", "") if isinstance(body, dict) else ""
        for chunk in self._chunks(reply, model):
            await self._send(reader, writer, f"data: {json.dumps(chunk)}\n\n", reply.delay_s)
        if reply.fail == "drop":
            return  # closing now leaves the chunked body incomplete
        if reply.fail == "error":
            error = {"error": {"message": "the model crashed", "type": "server_error"}}
            await self._send(reader, writer, f"data: {json.dumps(error)}\n\n", 0)
        elif reply.fail is None:
            finish = "tool_calls" if reply.tool_calls else "stop"
            await self._send(reader, writer, "data: " + json.dumps(
                _chunk(model, {}, finish)) + "\n\n", reply.delay_s)
            options = body.get("stream_options") if isinstance(body, dict) else None
            if reply.usage is not None and isinstance(options, dict) and options.get(
                    "include_usage"):
                usage = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                         "created": 0, "model": model, "choices": [], "usage": reply.usage}
                await self._send(reader, writer, f"data: {json.dumps(usage)}\n\n", 0)
            await self._send(reader, writer, "data: [DONE]\n\n", 0)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _send(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    event: str, delay_s: float) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        if reader.at_eof():  # the client closed its side: it will read no more
            raise ConnectionResetError("the client went away")
        data = event.encode()
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()

    @staticmethod
    def _status_line(status: int) -> bytes:
        return f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\n".encode()

    @staticmethod
    def _completion(reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for c in reply.tool_calls]
        finish = "tool_calls" if reply.tool_calls else "stop"
        return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}]}

    @staticmethod
    def _chunks(reply: Reply, model: str) -> list[dict[str, Any]]:
        size = reply.chunk_chars
        chunks = [_chunk(model, {"role": "assistant", "content": ""})]
        chunks += [_chunk(model, {"content": reply.content[i:i + size]})
                   for i in range(0, len(reply.content), size)]
        for index, call in enumerate(reply.tool_calls):
            chunks.append(_chunk(model, {"tool_calls": [{
                "index": index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}]}))
            arguments = json.dumps(call.arguments)
            step = max(1, len(arguments) // 3 + 1)  # three fragments or so
            chunks += [_chunk(model, {"tool_calls": [{
                "index": index, "function": {"arguments": arguments[i:i + step]}}]})
                for i in range(0, len(arguments), step)]
        return chunks


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
            "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
