"""A PydanticAI agent (`pydantic_ai.Agent`) as a runlease agent.

    # myapp/agents.py
    from pydantic_ai import Agent

    support_agent = Agent("openai-chat:gpt-4o-mini", instructions="...")

    @support_agent.tool_plain
    async def lookup(order: str) -> str: ...

    $ runlease worker --agent myapp.agents:support_agent

Input: `{"input": "text"}`, optionally with `"message_history"` (earlier
messages as PydanticAI's JSON, `ModelMessagesTypeAdapter`). Result:
`{"output": the run's output as JSON, "new_messages": [PydanticAI's JSON of
the messages this run added]}`.

Durable, through PydanticAI's own seams (a `WrapperModel` and a capability,
no fork of its graph):
- each model request goes through a `WrapperModel` around the agent's model:
  request n is the step `model-<n>` (the `ModelResponse` as JSON), streamed
  from the model as `message.delta` events the first time, rebuilt without a
  call on a replay; its usage goes to ctx.record_usage; each request is a
  turn (ctx.begin_turn);
- each tool execution goes through the capability's `wrap_tool_execute`: a
  call is the step `tool-<n>-<call id>` (`tool.call`, `tool.result`), run once;
- a deferred tool (`requires_approval=True`, or one raising `ApprovalRequired`
  or `CallDeferred`) ends PydanticAI's run with `DeferredToolRequests`: each
  approval is ctx.wait_for_input(`approve-<call id>`, boolean), each external
  call ctx.wait_for_input(`result-<call id>`) whose answer is the tool's
  result; the run parks holding no slot, and goes on with PydanticAI's
  `DeferredToolResults` when answered;
- messages sent to the run are user prompts at its next model request (and a
  final answer with messages waiting gets one more run).

Not durable: what a tool does besides returning (it runs again only if the
worker died during it), output validators and history processors (they run
again on a replay, over the same replayed responses).

The model: an agent whose model is OpenAI's Chat Completions
(`Agent("openai:gpt-4o")`, whose model PydanticAI makes when the agent is
built), a bare name, or none (RUNLEASE_OPENAI_MODEL) is asked at
RUNLEASE_OPENAI_BASE_URL/OPENAI_BASE_URL with RUNLEASE_OPENAI_API_KEY/
OPENAI_API_KEY through the run's client, with no retries of its own; any
other Model instance is wrapped as it is. The key is scrubbed from
everything stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

try:
    from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, ToolDenied
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import (
        ModelAPIError,
        ModelQuotaExceededError,
        ModelRequestRejectedError,
        UnexpectedModelBehavior,
        UsageLimitExceeded,
    )
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        PartDeltaEvent,
        PartStartEvent,
        TextPart,
        TextPartDelta,
        ToolCallPart,
        UserPromptPart,
    )
    from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings
except ImportError:  # pragma: no cover - the extra is missing
    raise ImportError("PydanticAI is not installed: pip install 'runlease[pydantic-ai]'") from None

from runlease.agents.openai.failures import REJECTED, UNAVAILABLE
from runlease.agents.openai.scrub import Secrets
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

OPENAI_PREFIXES = ("openai:", "openai-chat:")


def adapt(obj: Agent[Any, Any]) -> Callable[[RunContext], Awaitable[dict[str, Any]]]:
    if not isinstance(obj, Agent):
        raise TypeError(f"not a pydantic_ai.Agent: {type(obj).__name__}")

    async def agent(ctx: RunContext) -> dict[str, Any]:
        return await run(ctx, obj)
    agent.__qualname__ = agent.__name__ = f"pydantic_ai({obj.name or 'agent'})"
    return agent


async def run(ctx: RunContext, agent: Agent[Any, Any]) -> dict[str, Any]:
    env = ModelEnv.load()
    prompt, history = parse_input(ctx.input)
    flow = Flow(ctx, env.secrets)
    client = env.client()
    try:
        model = DurableModel(_model(agent.model, env, client), flow)
        output_type: Any = agent.output_type
        if not _has_deferred(output_type):
            output_type = [output_type, DeferredToolRequests]
        tools = DurableTools(flow)
        start = len(history)
        deferred: DeferredToolResults | None = None
        while True:
            try:
                result = await agent.run(prompt, message_history=history, model=model,
                                         output_type=output_type, capabilities=[tools],
                                         deferred_tool_results=deferred)
            except UsageLimitExceeded as exc:
                raise FatalError(f"the agent ran over a usage limit: {exc}",
                                 code="usage_limit_exceeded") from None
            except UnexpectedModelBehavior as exc:
                raise RetryableError(flow.secrets.scrub(f"the model misbehaved: {exc}")[:1000],
                                     code="model_unavailable") from None
            history, prompt = list(result.all_messages()), None
            if isinstance(result.output, DeferredToolRequests):
                deferred = await _answers(ctx, result.output)
                continue
            deferred = None
            messages = await flow.after_run()
            if not messages:
                break
            # Told something while it answered: one more run for it.
            history = flow.history(history)
            flow.injected.clear()
            prompt = "\n\n".join(texts(messages))
    finally:
        await client.close()
    output = result.output
    return {"output": jsonable(output),
            "new_messages": ModelMessagesTypeAdapter.dump_python(history[start:], mode="json")}


def parse_input(value: dict[str, Any]) -> tuple[str | None, list[ModelMessage]]:
    check_keys(value, ("input", "message_history"))
    prompt = value.get("input")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise FatalError("input.input must be a non-empty string", code="bad_input")
    raw = value.get("message_history", [])
    try:
        history = ModelMessagesTypeAdapter.validate_python(raw)
    except ValueError as exc:
        raise FatalError(f"input.message_history is not PydanticAI's message JSON: "
                         f"{str(exc)[:500]}", code="bad_input") from None
    if prompt is None and not history:
        raise FatalError("input.input (a prompt) or input.message_history is required",
                         code="bad_input")
    return prompt, list(history)


def _has_deferred(output_type: Any) -> bool:
    if output_type is DeferredToolRequests:
        return True
    return isinstance(output_type, list | tuple) and DeferredToolRequests in output_type


def _model(model: Model | str | None, env: ModelEnv, client: Any) -> Model:
    """The agent's model. OpenAI's models (PydanticAI makes one from
    "openai:<name>", the Responses API, or "openai-chat:<name>", Chat
    Completions, when the agent is built) are made again on the run's
    client, same class, name and settings: the configured endpoint and key,
    no retries of the client's own. A bare name, or none
    (RUNLEASE_OPENAI_MODEL), is a Chat Completions model on that client.
    Any other model instance is used as it is, wrapped."""
    if type(model) in (OpenAIChatModel, OpenAIResponsesModel):
        assert isinstance(model, OpenAIChatModel | OpenAIResponsesModel)
        return type(model)(model.model_name, provider=OpenAIProvider(openai_client=client),
                           settings=model.settings)
    if isinstance(model, Model):
        return model
    name = model or env.model
    for prefix in OPENAI_PREFIXES:
        name = name.removeprefix(prefix)
    return OpenAIChatModel(name, provider=OpenAIProvider(openai_client=client))


async def _answers(ctx: RunContext, requests: DeferredToolRequests) -> DeferredToolResults:
    """Each deferred call answered by a person (wait_for_input parks the run
    until then; a replay gets the committed answers back)."""
    results = DeferredToolResults()
    for call in requests.approvals:
        answer = await ctx.wait_for_input(
            f"approve-{call_key(call.tool_call_id)}", prompt=_prompt("Run", call),
            schema={"type": "boolean"})
        results.approvals[call.tool_call_id] = True if answer is True else ToolDenied()
    for call in requests.calls:
        results.calls[call.tool_call_id] = await ctx.wait_for_input(
            f"result-{call_key(call.tool_call_id)}", prompt=_prompt("The result of", call))
    return results


def _prompt(verb: str, call: ToolCallPart) -> str:
    return f"{verb} the tool {call.tool_name}({call.args_as_json_str()[:2000]})?"


def _failure(secrets: Secrets, exc: Exception) -> Exception | None:
    """PydanticAI's model errors as the worker's outcomes: what a later
    attempt may get past (429, 5xx, a broken connection) is retryable, a
    refusal is fatal; the key scrubbed from the message (it may be quoted)."""
    if not isinstance(exc, ModelAPIError):
        return None
    status = getattr(exc, "status_code", None)
    shown = f"HTTP {status}: " if isinstance(status, int) else ""
    message = secrets.scrub(f"model API answered {shown}{type(exc).__name__}: {exc}")[:1000]
    if isinstance(exc, ModelRequestRejectedError | ModelQuotaExceededError) or (
            isinstance(status, int) and 400 <= status < 500 and status != 429):
        return FatalError(message, code=REJECTED)
    return RetryableError(message, code=UNAVAILABLE, retry_after_s=exc.retry_after)


class DurableTools(AbstractCapability[Any]):
    """Every tool execution of the run as a durable step."""

    def __init__(self, flow: Flow) -> None:
        self.flow = flow

    async def wrap_tool_execute(self, ctx: Any, *, call: ToolCallPart, tool_def: Any,
                                args: Any, handler: Any) -> Any:
        return await self.flow.tool_call(call.tool_call_id, call.tool_name, jsonable(args),
                                         lambda: handler(args))


class DurableModel(WrapperModel):
    """The agent's model, each request a durable step (streamed, then kept)."""

    def __init__(self, wrapped: Model, flow: Flow) -> None:
        super().__init__(wrapped)
        self.flow = flow

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        flow = self.flow
        n, taken, stored = await flow.begin_request()
        given = flow.with_messages(list(messages), [
            ModelRequest(parts=[UserPromptPart(t)]) for t in texts(taken)])

        async def request() -> dict[str, Any]:
            text = flow.stream()
            async with self.wrapped.request_stream(given, model_settings,
                                                   model_request_parameters) as stream:
                async for event in stream:
                    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                        await text.add(event.part.content)
                    elif isinstance(event, PartDeltaEvent) and isinstance(event.delta,
                                                                          TextPartDelta):
                        await text.add(event.delta.content_delta)
                response = stream.get()
            await flow.finished(n, await text.end(), response.usage.input_tokens,
                                response.usage.output_tokens)
            dumped = ModelMessagesTypeAdapter.dump_python([response], mode="json")
            return {"response": dumped[0]}

        if stored is None:
            stored = await flow.model_step(n, request, partial(_failure, flow.secrets))
        response = ModelMessagesTypeAdapter.validate_python([stored["response"]])[0]
        assert isinstance(response, ModelResponse)
        for part in response.parts:
            if isinstance(part, ToolCallPart):
                flow.call_turn[part.tool_call_id] = n
        return response

    @asynccontextmanager
    async def request_stream(self, messages: list[ModelMessage],
                             model_settings: ModelSettings | None,
                             model_request_parameters: ModelRequestParameters,
                             run_context: Any = None) -> AsyncIterator[StreamedResponse]:
        raise FatalError("the agent was run with streaming; runlease runs it with agent.run "
                         "and streams each request's text as message.delta events",
                         code="agent_misconfigured")
        yield  # pragma: no cover
