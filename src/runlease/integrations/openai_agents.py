"""An OpenAI Agents SDK agent (`agents.Agent`) as a runlease agent.

    # myapp/agents.py
    from agents import Agent, function_tool

    @function_tool
    def lookup(order: str) -> str: ...

    support_agent = Agent(name="support", instructions="...", tools=[lookup])

    $ runlease worker --agent myapp.agents:support_agent

Input: `{"input": "text"}` or `{"input": [Responses input items]}` (also
`{"messages": [{"role": "user", "content": ...}, ...]}`), and optionally
`"max_turns"` (the SDK's, default 10). Result: `{"final_output": ...,
"last_agent": name, "items": [the run's new items as Responses input items]}`.

Durable (the SDK's seams, not a fork of its loop):
- each model request goes through a `Model` that wraps the real one (a
  `ModelProvider` for agents that name a model, the instance for those that
  hold one): request n is the step `model-<n>`, keeping the SDK's
  `ModelResponse` as JSON; a replay rebuilds it without a call. The text
  streams as `message.delta` events while the request runs, its usage goes
  to ctx.record_usage, and each request is a turn (ctx.begin_turn);
- each function tool's `on_invoke_tool` is wrapped: a call is the step
  `tool-<n>-<call id>` (`tool.call` and `tool.result` events), run once;
- a tool with `needs_approval` interrupts the SDK's run; each interruption is
  ctx.wait_for_input(`approve-<call id>`, boolean): the run parks holding no
  slot, and the answer approves or rejects the call when the run resumes
  (the SDK's own RunState.approve/reject);
- messages sent to the run are user input at its next model request (and a
  final answer with messages waiting gets one more run).

Not durable: what a tool does outside its return value (make it safe to
repeat, or it is repeated only if the worker dies during the call), hosted
tools run by the model's server, and agents reached through a `Handoff`
object rather than an Agent (their own tools are not wrapped).

The model: agents that name a model by string (or none:
RUNLEASE_OPENAI_MODEL) go to RUNLEASE_OPENAI_BASE_URL/OPENAI_BASE_URL with
RUNLEASE_OPENAI_API_KEY/OPENAI_API_KEY through Chat Completions (what every
OpenAI-compatible server speaks), with no retries of the client's own: a
failed request ends the attempt (model_unavailable, retried by the queue;
model_rejected for a refusal). The key is scrubbed from everything stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

try:
    import agents
    from agents import Agent, FunctionTool, ModelSettings, RunConfig, Runner
    from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
    from agents.items import ModelResponse, TResponseOutputItem
    from agents.models.interface import Model, ModelProvider
    from agents.models.openai_provider import OpenAIProvider
    from agents.usage import Usage
except ImportError:  # pragma: no cover - the extra is missing
    raise ImportError("the OpenAI Agents SDK is not installed: "
                      "pip install 'runlease[openai-agents]'") from None
from pydantic import TypeAdapter

from runlease.integrations.durable import (
    Flow,
    ModelEnv,
    call_key,
    check_keys,
    jsonable,
    texts,
)
from runlease.worker import FatalError, RetryableError, RunContext

__all__ = ["adapt"]

_OUTPUT_ITEMS: TypeAdapter[list[TResponseOutputItem]] = TypeAdapter(list[TResponseOutputItem])


def adapt(obj: Agent[Any]) -> Callable[[RunContext], Awaitable[dict[str, Any]]]:
    if not isinstance(obj, Agent):
        raise TypeError(f"not an agents.Agent: {type(obj).__name__}")
    agents.set_tracing_disabled(True)  # traces would go to OpenAI's servers, with the key

    async def agent(ctx: RunContext) -> dict[str, Any]:
        return await run(ctx, obj)
    agent.__qualname__ = agent.__name__ = f"openai_agents({obj.name})"
    return agent


async def run(ctx: RunContext, starting: Agent[Any]) -> dict[str, Any]:
    env = ModelEnv.load()
    items, max_turns = parse_input(ctx.input)
    flow = Flow(ctx, env.secrets)
    client = env.client()
    try:
        provider = DurableProvider(OpenAIProvider(openai_client=client, use_responses=False),
                                   flow, env.model)
        durable = durable_agents(starting, flow)
        config = RunConfig(model_provider=provider, tracing_disabled=True)
        result = await _run(durable, items, config, max_turns, flow, ctx)
    finally:
        await client.close()
    return {"final_output": jsonable(result.final_output), "last_agent": result.last_agent.name,
            "items": jsonable(result.to_input_list())}


async def _run(agent: Agent[Any], items: Any, config: RunConfig, max_turns: int,
               flow: Flow, ctx: RunContext) -> Any:
    state: Any = items
    while True:
        try:
            result = await Runner.run(agent, state, run_config=config, max_turns=max_turns)
        except MaxTurnsExceeded as exc:
            raise FatalError(f"the agent ran over its max_turns: {exc}",
                             code="max_turns_exceeded") from None
        except ModelBehaviorError as exc:
            raise RetryableError(flow.secrets.scrub(f"the model misbehaved: {exc}"),
                                 code="model_unavailable") from None
        if result.interruptions:
            state = result.to_state()
            for item in result.interruptions:
                if await _approved(ctx, item):
                    state.approve(item)
                else:
                    state.reject(item)
            continue
        messages = await flow.after_run()
        if not messages:
            return result
        # Told something while it answered: one more run, with the answer and
        # what came in the conversation.
        state = flow.history(result.to_input_list()) + [
            {"role": "user", "content": t} for t in texts(messages)]
        flow.injected.clear()
        agent = result.last_agent  # the agent that answered goes on (a handoff's)


async def _approved(ctx: RunContext, item: Any) -> bool:
    raw = item.raw_item
    call_id = str(getattr(raw, "call_id", None) or (raw.get("call_id") if isinstance(raw, dict)
                                                    else "") or "call")
    arguments = getattr(raw, "arguments", None) or (raw.get("arguments") if isinstance(
        raw, dict) else None) or ""
    prompt = f"Run the tool {item.tool_name}({str(arguments)[:2000]})?"
    answer = await ctx.wait_for_input(f"approve-{call_key(call_id)}"[:200], prompt=prompt,
                                      schema={"type": "boolean"})
    return answer is True


def parse_input(value: dict[str, Any]) -> tuple[str | list[Any], int]:
    check_keys(value, ("input", "messages", "max_turns"))
    given = value.get("input", value.get("messages"))
    if isinstance(given, str) and given:
        items: str | list[Any] = given
    elif isinstance(given, list) and given and all(isinstance(i, dict) for i in given):
        items = list(given)
    else:
        raise FatalError("input.input must be a non-empty string or a list of input items "
                         "(or input.messages a list of chat messages)", code="bad_input")
    max_turns = value.get("max_turns", 10)
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or not 1 <= max_turns <= 1000:
        raise FatalError("input.max_turns must be an integer from 1 to 1000", code="bad_input")
    return items, max_turns


# -- the agent graph, its tools wrapped ---------------------------------------------------


def durable_agents(starting: Agent[Any], flow: Flow) -> Agent[Any]:
    """A copy of the agent (and of the agents it hands off to) whose function
    tools are steps and whose model, if it holds one, is wrapped."""
    copies: dict[int, Agent[Any]] = {}

    def copy(agent: Agent[Any]) -> Agent[Any]:
        if id(agent) in copies:
            return copies[id(agent)]
        model = agent.model
        clone = agent.clone(
            tools=[_durable_tool(t, flow) if isinstance(t, FunctionTool) else t
                   for t in agent.tools],
            model=DurableModel(model, flow) if isinstance(model, Model)
            and not isinstance(model, DurableModel) else model)
        copies[id(agent)] = clone
        clone.handoffs = [copy(h) if isinstance(h, Agent) else h for h in agent.handoffs]
        return clone
    return copy(starting)


def _durable_tool(tool: FunctionTool, flow: Flow) -> FunctionTool:
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(tool_ctx: Any, arguments: str) -> Any:
        call_id = str(getattr(tool_ctx, "tool_call_id", "") or "")
        return await flow.tool_call(call_id, tool.name, arguments,
                                    lambda: invoke(tool_ctx, arguments))
    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


# -- the model ----------------------------------------------------------------------------


class DurableProvider(ModelProvider):
    """Models by name from the wrapped provider, each wrapped (the default
    when the agent names none: RUNLEASE_OPENAI_MODEL)."""

    def __init__(self, inner: ModelProvider, flow: Flow, default_model: str) -> None:
        self.inner, self.flow, self.default_model = inner, flow, default_model

    def get_model(self, model_name: str | None) -> Model:
        return DurableModel(self.inner.get_model(model_name or self.default_model), self.flow)


class DurableModel(Model):
    """A model whose every request is a durable step (streamed, then kept)."""

    def __init__(self, inner: Model, flow: Flow) -> None:
        self.inner, self.flow = inner, flow

    async def close(self) -> None:
        await self.inner.close()

    async def get_response(self, system_instructions: str | None, input: Any,  # noqa: A002
                           model_settings: ModelSettings, tools: Any, output_schema: Any,
                           handoffs: Any, tracing: Any, **kwargs: Any) -> ModelResponse:
        flow = self.flow
        n, messages, stored = await flow.begin_request()
        given = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        items = flow.with_messages(given, [{"role": "user", "content": t}
                                           for t in texts(messages)])
        if model_settings.include_usage is None:
            model_settings = dataclasses.replace(model_settings, include_usage=True)

        async def request() -> dict[str, Any]:
            text = flow.stream()
            response: Any = None
            async for event in self.inner.stream_response(
                    system_instructions, items, model_settings, tools, output_schema, handoffs,
                    tracing, **kwargs):
                kind = getattr(event, "type", "")
                if kind == "response.output_text.delta":
                    await text.add(str(getattr(event, "delta", "")))
                elif kind == "response.completed":
                    response = getattr(event, "response", None)
                elif kind in ("response.failed", "response.incomplete", "error"):
                    raise RetryableError(flow.secrets.scrub(
                        f"the model's stream failed: {kind}")[:1000], code="model_unavailable")
            if response is None:
                raise RetryableError("the model's stream ended before its response was "
                                     "complete", code="model_unavailable")
            usage = response.usage
            await flow.finished(n, await text.end(),
                                getattr(usage, "input_tokens", 0) if usage else 0,
                                getattr(usage, "output_tokens", 0) if usage else 0)
            return {"output": [o.model_dump(mode="json") for o in response.output],
                    "response_id": response.id,
                    "usage": {"input_tokens": getattr(usage, "input_tokens", 0) or 0,
                              "output_tokens": getattr(usage, "output_tokens", 0) or 0}
                    if usage else None}

        if stored is None:
            stored = await flow.model_step(n, request)
        for output in stored["output"]:
            if output.get("type") == "function_call" and isinstance(output.get("call_id"), str):
                flow.call_turn[output["call_id"]] = n
        usage = stored.get("usage") or {}
        return ModelResponse(
            output=_OUTPUT_ITEMS.validate_python(stored["output"]),
            usage=Usage(requests=1, input_tokens=int(usage.get("input_tokens", 0)),
                        output_tokens=int(usage.get("output_tokens", 0)),
                        total_tokens=int(usage.get("input_tokens", 0))
                        + int(usage.get("output_tokens", 0))),
            response_id=stored.get("response_id"))

    async def stream_response(self, system_instructions: str | None, input: Any,  # noqa: A002
                              model_settings: ModelSettings, tools: Any, output_schema: Any,
                              handoffs: Any, tracing: Any, **kwargs: Any
                              ) -> AsyncIterator[Any]:
        """Runner.run_streamed: the same durable request; its events are the
        run's events (message.delta), so the SDK's stream gets the completed
        response only."""
        from openai.types.responses import Response, ResponseCompletedEvent

        response = await self.get_response(system_instructions, input, model_settings, tools,
                                           output_schema, handoffs, tracing, **kwargs)
        yield ResponseCompletedEvent(
            type="response.completed", sequence_number=0,
            response=Response.model_construct(
                id=response.response_id or "resp", output=response.output, object="response",
                created_at=0, model="", parallel_tool_calls=False, tool_choice="auto",
                tools=[]))
