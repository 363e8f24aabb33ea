"""A scripted model for trying agents offline: an OpenAI-compatible Chat
Completions server on 127.0.0.1 that answers from the conversation alone.

`runlease dev --agent module:agent` starts it when no model is configured
(no OPENAI_BASE_URL, RUNLEASE_OPENAI_BASE_URL, OPENAI_API_KEY or
RUNLEASE_OPENAI_API_KEY) and points the workers at it, so an agent of the
OpenAI Agents SDK or PydanticAI runs end to end without a key:

- while a tool offered in the request has not been called since the last
  user message, it calls the next one (one a turn), its arguments made up
  from the tool's JSON schema (strings: the user's words);
- then it answers in text, naming what each tool returned,

streamed a few characters at a time (with usage, when asked), so the
console shows the tokens, the tool calls and their results as they come.
Stateless: any number of runs, in any order, each gets the same script.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

CHUNK_CHARS = 6
CHUNK_DELAY_S = 0.03
BODY_MAX_BYTES = 8 * 1024 * 1024


class ScriptedModel:
    """`async with ScriptedModel() as model:` ... `model.base_url`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 delay_s: float = CHUNK_DELAY_S) -> None:
        self.host, self.port, self.delay_s = host, port, delay_s
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> ScriptedModel:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
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
        return f"http://{self.host}:{port}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            request_line, *lines = head.split("\r\n")
            path = request_line.split(" ")[1] if request_line.count(" ") >= 2 else ""
            headers = {k.strip().lower(): v.strip()
                       for k, _, v in (line.partition(":") for line in lines if line)}
            length = int(headers.get("content-length", "0") or 0)
            if not path.endswith("/chat/completions") or not 0 < length <= BODY_MAX_BYTES:
                await _plain(writer, 404, {"error": {"message": "only POST /v1/chat/completions",
                                                     "type": "not_found"}})
                return
            body = json.loads(await reader.readexactly(length))
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            await self._answer(writer, body)
        except (ValueError, UnicodeDecodeError):
            await _plain(writer, 400, {"error": {"message": "not a chat completion request",
                                                 "type": "invalid_request_error"}})
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        model = str(body.get("model", "scripted"))
        content, call = next_turn(body)
        chunks = [_chunk(model, {"role": "assistant", "content": ""})]
        chunks += [_chunk(model, {"content": content[i:i + CHUNK_CHARS]})
                   for i in range(0, len(content), CHUNK_CHARS)]
        if call is not None:
            chunks.append(_chunk(model, {"tool_calls": [{
                "index": 0, "id": call["id"], "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]}}]}))
        chunks.append(_chunk(model, {}, "tool_calls" if call else "stop"))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            prompt = len(json.dumps(body.get("messages", ""))) // 4
            completion = max(1, len(content) // 4)
            chunks.append({"id": "chatcmpl-scripted", "object": "chat.completion.chunk",
                           "created": 0, "model": model, "choices": [],
                           "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                     "total_tokens": prompt + completion}})
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": content or None}
            if call is not None:
                message["tool_calls"] = [{"id": call["id"], "type": "function", "function": {
                    "name": call["name"], "arguments": call["arguments"]}}]
            await _plain(writer, 200, {
                "id": "chatcmpl-scripted", "object": "chat.completion", "created": 0,
                "model": model, "choices": [{"index": 0, "message": message, "finish_reason":
                                             "tool_calls" if call else "stop"}]})
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        for chunk in chunks:
            await asyncio.sleep(self.delay_s)
            _write_chunk(writer, f"data: {json.dumps(chunk)}\n\n")
            await writer.drain()
        _write_chunk(writer, "data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def next_turn(body: dict[str, Any]) -> tuple[str, dict[str, str] | None]:
    """The reply to a request: (text, the tool call to make or None)."""
    messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    asked = _text(messages[last_user].get("content")) if last_user >= 0 else ""
    since = messages[last_user + 1:]
    called = {c.get("function", {}).get("name") for m in since if m.get("role") == "assistant"
              for c in (m.get("tool_calls") or []) if isinstance(c, dict)}
    results = [m for m in since if m.get("role") == "tool"]
    names = {c.get("id"): c.get("function", {}).get("name") for m in since
             for c in (m.get("tool_calls") or []) if isinstance(c, dict)}
    for tool in body.get("tools") or []:
        function = tool.get("function", {}) if isinstance(tool, dict) else {}
        name = function.get("name")
        if isinstance(name, str) and name not in called:
            arguments = _arguments(function.get("parameters"), asked)
            return "", {"id": f"call_{len(since)}_{name}"[:64], "name": name,
                        "arguments": json.dumps(arguments)}
    said = [f"{names.get(r.get('tool_call_id'), 'a tool')} returned: "
            f"{_text(r.get('content'))[:300]}" for r in results]
    answer = f"(scripted model) You asked: {asked[:300]}"
    return answer + ("\n" + "\n".join(said) if said else ""), None


def _arguments(schema: Any, words: str) -> dict[str, Any]:
    """Arguments that fit the tool's JSON schema, made up."""
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    made: dict[str, Any] = {}
    for name, spec in properties.items() if isinstance(properties, dict) else ():
        kind = spec.get("type") if isinstance(spec, dict) else None
        made[name] = {"integer": 1, "number": 1, "boolean": True, "array": [],
                      "object": {}}.get(kind, words[:80] or name) if isinstance(kind, str) \
            else words[:80] or name
    return made


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: [{"type": "text", "text": ...}]
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0,
            "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _write_chunk(writer: asyncio.StreamWriter, event: str) -> None:
    data = event.encode()
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


async def _plain(writer: asyncio.StreamWriter, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Status")
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    with contextlib.suppress(ConnectionError):
        await writer.drain()
