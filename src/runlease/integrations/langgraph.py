"""LangGraph graphs as runlease runs (issue 30): `runlease worker --agent
myapp.graphs:graph` names a compiled graph (or a StateGraph, compiled here).

    run input   {"input": <graph input>, "recursion_limit"?: n}, or the graph
                input itself (say {"messages": [...]}) when it has no "input" key
    thread      the run's id, or the run's runlease thread (a conversation goes
                on across the thread's runs: its graph state is the thread's)
    result      {"output": last message text, "messages": the last 50 messages,
                 "values": the other state keys, "thread_id", "checkpoint_id"}

Durable: the graph runs with `RunleaseSaver`, a checkpoint saver whose every
write is fenced by the run's lease (sql/checkpoints.sql), with durability
"sync" (a step's checkpoint is committed before the next step starts). A run
re-claimed after a crash finds the checkpoints its earlier attempt wrote and
resumes from the last one: a node whose step committed never runs again (a
node that was running when the worker died runs again: at least once). A
stale attempt cannot write a checkpoint: its lease is gone.

Seen on the run's stream: the model's tokens (stream mode "messages") as
`message.delta`, each complete assistant message with text as `message`,
tool calls and results (LangChain tools) as `tool.call` / `tool.result`, the
kinds the built-in OpenAI agent emits. A model call counts as a turn
(`max_turns`), a tool call as a tool call, and a message's `usage_metadata`
goes to `record_usage`. A Stop cancels the graph's task at once.

People: `interrupt(value)` in a node parks the run (`wait_for_input`, name
`interrupt-<id>`; a string value is the prompt, a dict may give "prompt",
"schema" and "timeout_s"); the answer resumes the graph with
`Command(resume=answer)`. Messages sent to the run: when the graph's state
has a `messages` channel, those waiting when the run starts join its input,
and those that came while the graph ran start one more pass of the graph
with them as user messages, until none is waiting; for other graphs they
stay in the inbox.

Inside a node or a tool, `run_context()` is the run's RunContext: a process
started with `run_context().run_tool(argv)` is ended with its group by a Stop
(a sync function runs in a thread, which a Stop cannot end).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import LLMResult
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt

from runlease.db.checkpoints import MAX_LIST, StoredCheckpoint
from runlease.errors import SettingsError, ValidationError
from runlease.integrations.running import bind
from runlease.worker import FatalError, RunCancelled, RunContext

EVENT_TEXT_CHARS = 8192  # as the OpenAI agent: events stay well inside their bound
RESULT_MESSAGES = 50
MAX_RECURSION_LIMIT = 1000
TAKES_KEY = "runlease_takes"  # checkpoint metadata: the message takes fed so far

class RunleaseSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpoint saver for one attempt of one run: writes are
    fenced by its lease (LeaseLost once it is gone), reads and writes are
    the run's tenant's and only of the run's own graph threads (its id, its
    runlease thread). Async only: graphs run with ainvoke/astream here."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__()
        self._ctx = ctx
        # The graph's thread_id -> the key its checkpoints are stored under:
        # "run:" or "thread:" before the id, so a runlease thread named like
        # a run's id is still another graph thread.
        self.keys = {str(ctx.run_id): f"run:{ctx.run_id}"}
        if ctx.thread_id:
            self.keys[ctx.thread_id] = f"thread:{ctx.thread_id}"

    def _where(self, config: RunnableConfig) -> tuple[str, str]:
        """(the stored thread key, the namespace) of a config of the run's own."""
        configurable = config.get("configurable") or {}
        key = self.keys.get(str(configurable.get("thread_id")))
        if key is None:
            raise FatalError("a graph of this run may use only its own threads "
                             f"({', '.join(sorted(self.keys))})", code="graph_thread_refused")
        return key, str(configurable.get("checkpoint_ns") or "")

    def _config(self, key: str, ns: str, checkpoint_id: str) -> RunnableConfig:
        thread = next(t for t, k in self.keys.items() if k == key)
        return {"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint_id}}

    async def _io(self, op: Callable[[], Awaitable[Any]]) -> Any:
        # Through the context's fenced writer: database trouble is ridden out,
        # never past the attempt's fence. Refusals of bounds end the run.
        try:
            return await self._ctx._write(op)  # the run's one fenced door
        except ValidationError as exc:
            raise FatalError(f"graph checkpoint: {exc}", code="checkpoint_refused") from None

    async def _tuple(self, thread: str, row: StoredCheckpoint) -> CheckpointTuple:
        ctx = self._ctx
        writes = await self._io(lambda: ctx.store.get_graph_writes(
            ctx.tenant_id, thread, row.ns, row.checkpoint_id))
        return CheckpointTuple(
            config=self._config(thread, row.ns, row.checkpoint_id),
            checkpoint=self.serde.loads_typed((row.type, row.data)),
            metadata=row.metadata,  # type: ignore[arg-type]
            parent_config=self._config(thread, row.ns, row.parent_id) if row.parent_id else None,
            pending_writes=[(w.task_id, w.channel, self.serde.loads_typed((w.type, w.value)))
                            for w in writes])

    async def latest(self, thread: str) -> StoredCheckpoint | None:
        """The newest checkpoint of one of the run's graph threads."""
        key, ns = self._where({"configurable": {"thread_id": thread}})
        ctx = self._ctx
        row: StoredCheckpoint | None = await self._io(
            lambda: ctx.store.get_graph_checkpoint(ctx.tenant_id, key, ns))
        return row

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread, ns = self._where(config)
        ctx = self._ctx
        checkpoint_id = get_checkpoint_id(config)
        row: StoredCheckpoint | None = await self._io(
            lambda: ctx.store.get_graph_checkpoint(ctx.tenant_id, thread, ns, checkpoint_id))
        return None if row is None else await self._tuple(thread, row)

    async def alist(
        self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,  # noqa: A002
        before: RunnableConfig | None = None, limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        if config is None:
            raise FatalError("listing checkpoints needs a thread_id", code="graph_thread_refused")
        thread, _ = self._where(config)
        configurable = config.get("configurable") or {}
        ctx = self._ctx
        rows: list[StoredCheckpoint] = await self._io(lambda: ctx.store.list_graph_checkpoints(
            ctx.tenant_id, thread, ns=configurable.get("checkpoint_ns"),
            checkpoint_id=get_checkpoint_id(config),
            before=get_checkpoint_id(before) if before else None, filter_=filter,
            limit=max(1, min(MAX_LIST, limit if limit is not None else MAX_LIST))))
        for row in rows:
            yield await self._tuple(thread, row)

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        thread, ns = self._where(config)
        # The values inline: a checkpoint stands alone, so pruning or a
        # retention's cascade never takes a value a newer one reads.
        type_, data = self.serde.dumps_typed(checkpoint)
        meta = get_serializable_checkpoint_metadata(config, metadata)
        parent = (config.get("configurable") or {}).get("checkpoint_id")
        ctx = self._ctx
        await self._io(lambda: ctx.store.put_graph_checkpoint(
            ctx.lease, thread=thread, ns=ns, checkpoint_id=checkpoint["id"], parent_id=parent,
            type_=type_, data=data, metadata=meta))
        return self._config(thread, ns, checkpoint["id"])

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        if not writes:
            return
        thread, ns = self._where(config)
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id is None:
            raise FatalError("graph writes without a checkpoint", code="checkpoint_refused")
        rows = [(WRITES_IDX_MAP.get(channel, idx), channel, *self.serde.dumps_typed(value))
                for idx, (channel, value) in enumerate(writes)]
        ctx = self._ctx
        await self._io(lambda: ctx.store.put_graph_writes(
            ctx.lease, thread=thread, ns=ns, checkpoint_id=checkpoint_id, task_id=task_id,
            task_path=task_path, writes=rows))


class RunEvents(AsyncCallbackHandler):
    """LangChain callbacks -> the run's budget and events: a model call is a
    turn, its usage is recorded, a tool call and its result are events."""

    raise_error = True  # a spent budget or a lost lease must stop the graph

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.tools: dict[UUID, tuple[str, str]] = {}

    async def on_chat_model_start(self, serialized: dict[str, Any],
                                  messages: list[list[BaseMessage]], **kwargs: Any) -> None:
        await self.ctx.begin_turn()

    async def on_llm_start(self, serialized: dict[str, Any], prompts: list[str],
                           **kwargs: Any) -> None:
        await self.ctx.begin_turn()

    async def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        for generations in response.generations:
            for generation in generations:
                message = getattr(generation, "message", None)
                if not isinstance(message, BaseMessage):
                    continue
                usage = getattr(message, "usage_metadata", None) or {}
                if usage:
                    await self.ctx.record_usage(
                        input_tokens=int(usage.get("input_tokens") or 0),
                        output_tokens=int(usage.get("output_tokens") or 0))
                text = message_text(message)
                if text:
                    await self.ctx.emit("message", {
                        "role": "assistant", "content": text[:EVENT_TEXT_CHARS],
                        "truncated": len(text) > EVENT_TEXT_CHARS})

    async def on_tool_start(self, serialized: dict[str, Any], input_str: str, *,
                            run_id: UUID, inputs: dict[str, Any] | None = None,
                            **kwargs: Any) -> None:
        self.ctx.count_tool_call()
        call_id = str(kwargs.get("tool_call_id") or run_id)
        name = str(kwargs.get("name") or serialized.get("name") or "tool")[:200]
        self.tools[run_id] = (call_id, name)
        shown = jsonable(inputs) if inputs is not None else input_str
        if len(json.dumps(shown)) > EVENT_TEXT_CHARS:
            shown = json.dumps(shown)[:EVENT_TEXT_CHARS]
        await self.ctx.emit("tool.call", {"id": call_id, "name": name, "arguments": shown})

    async def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        call_id, name = self.tools.pop(run_id, (str(run_id), "tool"))
        text = message_text(output) if isinstance(output, BaseMessage) else str(output)
        await self.ctx.emit("tool.result", {"id": call_id, "name": name,
                                            "result": text[:EVENT_TEXT_CHARS]})

    async def on_tool_error(self, error: BaseException, *, run_id: UUID,
                            **kwargs: Any) -> None:
        call_id, name = self.tools.pop(run_id, (str(run_id), "tool"))
        await self.ctx.emit("tool.result", {"id": call_id, "name": name,
                                            "error": str(error)[:EVENT_TEXT_CHARS]})


def message_text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(part if isinstance(part, str) else str(part.get("text", ""))
                   for part in content if isinstance(part, str | dict))


def message_json(message: BaseMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"type": message.type, "content": jsonable(message.content)}
    for key in ("id", "name", "tool_call_id"):
        if (value := getattr(message, key, None)) is not None:
            out[key] = str(value)
    if calls := getattr(message, "tool_calls", None):
        out["tool_calls"] = jsonable(calls)
    return out


def jsonable(value: Any) -> Any:
    def default(obj: Any) -> Any:
        if isinstance(obj, BaseMessage):
            return message_json(obj)
        if hasattr(obj, "model_dump"):
            return obj.model_dump(mode="json")
        return str(obj)
    return json.loads(json.dumps(value, default=default))


class GraphRun:
    """One attempt of a run of a graph (see the module's docstring)."""

    def __init__(self, graph: Pregel[Any, Any, Any, Any], ctx: RunContext) -> None:
        self.ctx = ctx
        self.saver = RunleaseSaver(ctx)
        self.graph = graph.copy(update={"checkpointer": self.saver})
        self.thread = ctx.thread_id or str(ctx.run_id)
        self.chatty = "messages" in self.graph.channels
        self.takes = 0
        raw = ctx.input
        limit = raw.get("recursion_limit", 25) if "input" in raw else 25
        if isinstance(limit, bool) or not isinstance(limit, int) \
                or not 1 <= limit <= MAX_RECURSION_LIMIT:
            raise FatalError(f"recursion_limit must be 1-{MAX_RECURSION_LIMIT}",
                             code="invalid_input")
        self.config: RunnableConfig = {
            "configurable": {"thread_id": self.thread}, "recursion_limit": limit,
            "callbacks": [RunEvents(ctx)]}

    async def take(self) -> list[dict[str, Any]]:
        if not self.chatty:
            return []
        self.takes += 1
        return await self.ctx.take_messages()

    async def run(self) -> dict[str, Any]:
        bind(self.ctx)  # the agent's own task: its context dies with it
        latest = await self.saver.latest(self.thread)
        pending: Any
        if latest is not None and latest.run_id == self.ctx.run_id:
            # An earlier attempt of this run: replay the takes its passes were
            # fed (each a durable step), then go on from its last checkpoint.
            fed = latest.metadata.get(TAKES_KEY, 0)
            for _ in range(fed if isinstance(fed, int) else 0):
                await self.take()
            pending = await self.answers()
        else:
            pending = self.first_input(await self.take())
        while True:
            await self.guarded(self.one_pass(pending))
            snapshot = await self.graph.aget_state(self.config)
            if snapshot.interrupts:
                pending = await self.answers(snapshot.interrupts)
                continue
            messages = await self.take()
            if not messages:
                return self.result(snapshot.values, snapshot.config)
            pending = {"messages": [user_message(m) for m in messages]}

    def first_input(self, messages: list[dict[str, Any]]) -> Any:
        raw = self.ctx.input
        graph_input: Any = raw["input"] if "input" in raw else dict(raw)
        if messages:
            if not isinstance(graph_input, Mapping):
                raise FatalError("messages were sent to the run, but its graph input is "
                                 "not an object", code="invalid_input")
            before = graph_input.get("messages") or []
            graph_input = {**graph_input, "messages": [
                *(before if isinstance(before, list) else [before]),
                *(user_message(m) for m in messages)]}
        return graph_input

    async def answers(self, interrupts: Sequence[Interrupt] | None = None) -> Any:
        """The answers to the graph's open interrupts, as the Command that
        resumes it (each a wait_for_input: the first time, the run parks);
        None when there is none (the graph goes on from its checkpoint)."""
        if interrupts is None:
            interrupts = (await self.graph.aget_state(self.config)).interrupts
        if not interrupts:
            return None
        answers: dict[str, Any] = {}
        for it in interrupts:
            prompt, schema, timeout_s = interrupt_request(it)
            answers[it.id] = await self.ctx.wait_for_input(
                f"interrupt-{it.id[:50]}", prompt=prompt, schema=schema, timeout_s=timeout_s)
        return Command(resume=answers)

    async def one_pass(self, graph_input: Any) -> None:
        config: RunnableConfig = {**self.config, "metadata": {TAKES_KEY: self.takes}}
        async for mode, chunk in self.graph.astream(
                graph_input, config, stream_mode=["messages", "updates"], durability="sync"):
            if mode == "messages":
                message = chunk[0]
                if isinstance(message, AIMessageChunk) and (text := message_text(message)):
                    await self.ctx.delta(text)
        await self.ctx.flush()

    async def guarded(self, work: Awaitable[None]) -> None:
        """Run the graph until it ends, or stop it at once on a Stop."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self.ctx.sleep(10.0 ** 9))
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
                stop.result()  # RunCancelled
                raise RunCancelled("the run was cancelled")
            task.result()
        finally:
            for left in (task, stop):
                if not left.done():
                    left.cancel()
                    await asyncio.wait({left})

    def result(self, values: Any, config: RunnableConfig) -> dict[str, Any]:
        out: dict[str, Any] = {
            "thread_id": self.thread,
            "checkpoint_id": (config.get("configurable") or {}).get("checkpoint_id")}
        if isinstance(values, Mapping):
            messages = values.get("messages")
            if isinstance(messages, list) and all(isinstance(m, BaseMessage) for m in messages):
                last = next((m for m in reversed(messages) if m.type == "ai"), None)
                out["output"] = message_text(last) if last is not None else None
                out["messages"] = [message_json(m) for m in messages[-RESULT_MESSAGES:]]
                values = {k: v for k, v in values.items() if k != "messages"}
        out["values"] = jsonable(values)
        return out


def user_message(message: Mapping[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": str(message.get("text", ""))}


def interrupt_request(it: Interrupt) -> tuple[str | None, dict[str, Any] | None, float | None]:
    """(prompt, schema, timeout_s) of what an interrupt asks."""
    value = it.value
    schema = getattr(it, "response_schema", None)
    schema = schema if isinstance(schema, dict) else None
    timeout_s: float | None = None
    if isinstance(value, str):
        prompt: str | None = value
    elif isinstance(value, Mapping) and isinstance(value.get("prompt"), str):
        prompt = value["prompt"]
        schema = value["schema"] if isinstance(value.get("schema"), dict) else schema
        timeout = value.get("timeout_s")
        if isinstance(timeout, int | float) and not isinstance(timeout, bool):
            timeout_s = float(timeout)
    else:
        prompt = json.dumps(jsonable(value))
    return (prompt[:8192] if prompt is not None else None), schema, timeout_s


def adapt(obj: object) -> Callable[[RunContext], Awaitable[dict[str, Any]]]:
    """An agent that runs `obj` (a compiled graph, or a StateGraph to compile)."""
    graph = obj.compile() if isinstance(obj, StateGraph) else obj
    if not isinstance(graph, Pregel):
        raise SettingsError(f"a {type(obj).__name__} is not a LangGraph graph: name a "
                            "compiled graph (builder.compile()) or a StateGraph")

    async def agent(ctx: RunContext) -> dict[str, Any]:
        return await GraphRun(graph, ctx).run()

    agent.__name__ = f"langgraph:{getattr(graph, 'name', 'graph')}"
    return agent
