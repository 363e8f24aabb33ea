"""The scripted agent: runs the steps listed in the run's input.

    {"steps": [
        {"sleep": 0.5},
        {"shell": ["sh", "-c", "make test"], "timeout_s": 300},
        {"emit": {"text": "hello"}},
        {"usage": {"input_tokens": 800, "output_tokens": 90, "cost": 0.002}},
        {"input": {"name": "approve", "prompt": "Deploy?", "schema": {"type": "boolean"},
                   "timeout_s": 600}},
        {"receive": {"timeout_s": 60}},
        {"fail": "retryable", "until_attempt": 3}
    ]}

Each step is a durable step keyed by its index: a step committed by an
earlier attempt is not run again. A step's result records the lease epoch,
the attempt and the worker-side start and end instants, which the chaos test
uses to prove leases never overlapped. `fail` steps fail on every attempt
before `until_attempt` (always, without it) and pass from then on; a shell
step that exits non-zero is a retryable failure. A shell step's output is
stored as `tool.output` events while it runs ({"step", "stream", "text"}:
at most 64 KiB per step, redacted, never cut inside a secret), then one
`tool.exit` event ({"step", "returncode", "duration_s"}); the step's result
keeps the last 2000 characters of stdout. A `usage` step reports model usage
(ctx.record_usage; its result holds the run's totals over all attempts, and
a total over the budget ends the run `budget_exceeded`). An `input` step waits
for a person (ctx.wait_for_input: the run is `waiting`, holding no worker,
until POST /v1/runs/{id}/input answers; its result is {"value": answer}; past
timeout_s the run ends dead with input_timeout, or with "on_timeout":
"continue" the result is {"timed_out": true}); a `receive` step waits for the next message sent to
the run (ctx.receive; its result is {"message": ...}, null when timeout_s
passed first). A shell step sees RUNLEASE_RUN_ID,
RUNLEASE_STEP, RUNLEASE_ATTEMPT and RUNLEASE_LEASE_EPOCH in its environment,
beside what every tool gets (docs/agents.md: PATH, HOME, ... and the pool's
grants; never the worker's secrets).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from runlease.errors import ValidationError
from runlease.worker import FatalError, InputTimeout, RetryableError, RunContext

USAGE_FIELDS = frozenset({"input_tokens", "output_tokens", "cost"})


async def agent(ctx: RunContext) -> dict[str, Any]:
    steps = ctx.input.get("steps", [])
    if not isinstance(steps, list):
        raise FatalError("input.steps must be a list")
    results = []
    for index, spec in enumerate(steps):
        if not isinstance(spec, dict) or not spec:
            raise FatalError(f"input.steps[{index}] must be an object")
        if "fail" in spec:
            _maybe_fail(ctx, index, spec)
            continue
        if "input" in spec or "receive" in spec:
            # Durable steps of their own (input:<name>, message:<k>), taken in
            # the agent's order on every attempt: never inside ctx.step, whose
            # replay would skip them and put later takes out of step.
            outcome = await _person_step(ctx, index, spec)
            result = await ctx.step(f"{index}", partial(_stamped, ctx, index, outcome))
        else:
            result = await ctx.step(f"{index}", partial(_run_step, ctx, index, spec))
        results.append(result)
    return {"steps": len(results)}


def _maybe_fail(ctx: RunContext, index: int, spec: dict[str, Any]) -> None:
    kind = spec["fail"]
    until = spec.get("until_attempt")
    if until is not None and ctx.attempt >= int(until):
        return
    message = f"step {index} fails on attempt {ctx.attempt}"
    if kind == "fatal":
        raise FatalError(message)
    if kind == "retryable":
        raise RetryableError(message)
    raise FatalError(f"input.steps[{index}].fail must be 'retryable' or 'fatal'")


async def _run_step(ctx: RunContext, index: int, spec: dict[str, Any]) -> dict[str, Any]:
    started = time.time()
    out: dict[str, Any] = {"step": index, "lease_epoch": ctx.lease_epoch,
                           "attempt": ctx.attempt, "started_at": started}
    if "sleep" in spec:
        await ctx.sleep(float(spec["sleep"]))
    elif "shell" in spec:
        argv = spec["shell"]
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise FatalError(f"input.steps[{index}].shell must be a list of strings")
        # The run's id, attempt and epoch come from the worker; the step is ours.
        # Its output is shown live as `tool.output` events (never cut in a secret,
        # bounded, redacted), then a `tool.exit` event with the exit code.
        result = await ctx.run_tool(argv, timeout_s=spec.get("timeout_s"),
                                    env={"RUNLEASE_STEP": str(index)},
                                    output_event="tool.output", output_data={"step": index})
        await ctx.emit("tool.exit", {"step": index, "returncode": result.returncode,
                                     "duration_s": round(result.duration_s, 3)})
        if not result.ok:
            raise RetryableError(
                f"step {index}: {argv[0]} exited {result.returncode}: {result.stderr[-500:]}")
        out["returncode"] = result.returncode
        out["stdout"] = result.stdout[-2000:]
    elif "emit" in spec:
        data = spec["emit"]
        if not isinstance(data, dict):
            raise FatalError(f"input.steps[{index}].emit must be an object")
        out["seq"] = await ctx.emit(str(spec.get("kind", "message")), data)
    elif "usage" in spec:
        usage = spec["usage"]
        if not isinstance(usage, dict) or set(usage) - USAGE_FIELDS:
            raise FatalError(f"input.steps[{index}].usage: an object of {sorted(USAGE_FIELDS)}")
        try:
            out["usage"] = (await ctx.record_usage(**usage)).to_json()
        except ValidationError as exc:
            raise FatalError(f"input.steps[{index}].usage: {exc}", code="invalid_usage") from None
    else:
        raise FatalError(f"input.steps[{index}] has no known action: {sorted(spec)}")
    out["ended_at"] = time.time()
    return out


async def _wait_for_input(ctx: RunContext, index: int, options: Any) -> dict[str, Any]:
    if not isinstance(options, dict) or not isinstance(options.get("name"), str):
        raise FatalError(f"input.steps[{index}].input must be an object with a name")
    timeout_s = options.get("timeout_s")
    if timeout_s is not None and not isinstance(timeout_s, int | float):
        raise FatalError(f"input.steps[{index}].input.timeout_s must be a number")
    prompt = options.get("prompt")
    try:
        value = await ctx.wait_for_input(
            options["name"], prompt=None if prompt is None else str(prompt),
            schema=options.get("schema"), timeout_s=timeout_s)
    except InputTimeout:
        if options.get("on_timeout") != "continue":
            raise  # the run ends dead, input_timeout
        return {"timed_out": True}
    return {"value": value}


async def _receive(ctx: RunContext, index: int, options: Any) -> dict[str, Any] | None:
    if not isinstance(options, dict):
        raise FatalError(f"input.steps[{index}].receive must be an object")
    timeout_s = options.get("timeout_s")
    if timeout_s is not None and not isinstance(timeout_s, int | float):
        raise FatalError(f"input.steps[{index}].receive.timeout_s must be a number")
    return await ctx.receive(timeout_s=timeout_s)


async def _person_step(ctx: RunContext, index: int, spec: dict[str, Any]) -> dict[str, Any]:
    if "input" in spec:
        return await _wait_for_input(ctx, index, spec["input"])
    return {"message": await _receive(ctx, index, spec["receive"])}


async def _stamped(ctx: RunContext, index: int, outcome: dict[str, Any]) -> dict[str, Any]:
    now = time.time()
    return {"step": index, "lease_epoch": ctx.lease_epoch, "attempt": ctx.attempt,
            "started_at": now, **outcome, "ended_at": now}
