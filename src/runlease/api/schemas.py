"""Request and response bodies, as the OpenAPI spec shows them."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal, Self
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StringConstraints,
    model_validator,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import to_json

from runlease.core import backoff, bounds, run_options
from runlease.core.backoff import RetryPolicy
from runlease.core.run_fields import RunFields
from runlease.db.models import Run, Step

POOL_PATTERN = bounds.POOL_PATTERN
LabelKey = Annotated[str, StringConstraints(min_length=1,
                                            max_length=run_options.LABEL_KEY_MAX_CHARS,
                                            pattern=run_options.LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, StringConstraints(max_length=run_options.LABEL_VALUE_MAX_CHARS,
                                              pattern=run_options.LABEL_VALUE_PATTERN)]
Labels = dict[LabelKey, LabelValue]
Status = Literal["pending", "leased", "waiting", "done", "dead", "cancelled"]
# Printable, no spaces, not `*` alone (reserved): bounds.check_tenant.
TENANT_PATTERN = r"^([^\x00-\x20\x7f*][^\x00-\x20\x7f]*|\*[^\x00-\x20\x7f]+)$"
# What core/webhooks.host_of accepts, said in the document: http(s), a host
# name or IPv4 address (no credentials), a port, then printable ASCII.
WEBHOOK_URL_PATTERN = (r"^https?://[A-Za-z0-9]([A-Za-z0-9-]{0,62})?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62})?)*"
                       r"(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}"
                       r"|[0-9]{1,4}))?([/?#][!-~]*)?$")
# A tool's environment: a variable name, never one of the worker's own
# (bounds.check_tool_env refuses RUNLEASE_*, PG* and DATABASE_URL).
TOOL_ENV_PATTERN = r"^(?!RUNLEASE_|PG|DATABASE_URL$)[A-Z_][A-Z0-9_]{0,127}$"


def _integral(value: object) -> object:
    # JSON Schema's `integer` includes 3.0, and generic clients send it: take
    # a float with no fraction as the integer it is; anything else (a string,
    # a bool, 2.5) still fails the strict check below.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# After the bounds: pydantic's JSON schema keeps `minimum`/`maximum` only for
# constraints that come before a validator.
INTEGRAL = BeforeValidator(_integral)
Priority = Annotated[int, Field(strict=True, ge=bounds.PRIORITY_MIN, le=bounds.PRIORITY_MAX),
                     INTEGRAL]
Attempts = Annotated[int, Field(strict=True, ge=bounds.MAX_ATTEMPTS_MIN,
                                le=bounds.MAX_ATTEMPTS_MAX), INTEGRAL]
InFlight = Annotated[int, Field(strict=True, ge=0, le=bounds.MAX_IN_FLIGHT_MAX), INTEGRAL]
Turns = Annotated[int, Field(strict=True, ge=1, le=100_000), INTEGRAL]
ToolCalls = Annotated[int, Field(strict=True, ge=0, le=1_000_000), INTEGRAL]
LeaseS = Annotated[int, Field(strict=True, ge=bounds.LEASE_S_MIN, le=bounds.LEASE_S_MAX),
                   INTEGRAL]
AgingS = Annotated[int, Field(strict=True, ge=0, le=bounds.AGING_S_MAX), INTEGRAL]
RetentionS = Annotated[int, Field(strict=True, ge=0, le=bounds.RETENTION_S_MAX), INTEGRAL]
BackoffBase = Annotated[int, Field(strict=True, ge=0, le=backoff.BACKOFF_BASE_S_MAX), INTEGRAL]
BackoffCap = Annotated[int, Field(strict=True, ge=0, le=backoff.BACKOFF_CAP_S_MAX), INTEGRAL]
ErrorCode = Annotated[str, StringConstraints(pattern=backoff.ERROR_CODE_PATTERN)]


def _keys_are_tenants(schema: dict[str, Any]) -> None:
    # The store checks tenant ids and caps (naming the field as before,
    # `limits[acme]`); the document states the same rules.
    schema["propertyNames"] = {"minLength": 1, "maxLength": bounds.TENANT_MAX_CHARS,
                               "pattern": TENANT_PATTERN}
    if schema.get("additionalProperties", {}).get("type") == "integer":
        schema["additionalProperties"] = {"type": "integer", "minimum": 0,
                                          "maximum": bounds.MAX_IN_FLIGHT_MAX}


TenantId = Annotated[str, StringConstraints(min_length=1, max_length=bounds.TENANT_MAX_CHARS,
                                            pattern=TENANT_PATTERN)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


DEADLINE_S_MAX = 30 * 24 * 3600


class BudgetIn(Strict):
    max_turns: Turns | None = None
    max_tool_calls: ToolCalls | None = None
    deadline_s: (Annotated[StrictInt, Field(gt=0, le=DEADLINE_S_MAX)]
                 | Annotated[StrictFloat, Field(gt=0, le=DEADLINE_S_MAX)] | None) = None
    max_tokens: Annotated[int, Field(strict=True, ge=1, le=bounds.MAX_TOKENS_MAX),
                          INTEGRAL] | None = Field(
        None, description="Input plus output tokens, all attempts.")
    # Bounds on each member of the union: on the union itself the document
    # would not say them (and a 0 would look valid to a client).
    max_cost: (Annotated[StrictInt, Field(gt=0, le=bounds.MAX_COST_MAX)]
               | Annotated[StrictFloat, Field(gt=0, le=bounds.MAX_COST_MAX, allow_inf_nan=False)]
               | None) = Field(None, description="Model cost over all attempts (the unit the "
                                                 "agents report in).")


def not_a_number(value: object) -> object:
    """pydantic would read a number (`1700000000`) as a Unix time; the document
    says RFC 3339, so only that is taken."""
    if isinstance(value, int | float) or (
            isinstance(value, str) and re.fullmatch(r"\s*[-+]?[0-9.eE+-]+\s*", value)):
        raise ValueError("an RFC 3339 time with its offset, not a number")
    return value


def _label_keys(schema: dict[str, Any]) -> None:
    # pydantic writes a constrained key as patternProperties, which leaves
    # keys that do not match unconstrained: say that every key must match.
    for option in schema.get("anyOf", [schema]):
        values = option.pop("patternProperties", None)
        if values:
            option["additionalProperties"] = next(iter(values.values()))
            option["propertyNames"] = {"minLength": 1,
                                       "maxLength": run_options.LABEL_KEY_MAX_CHARS,
                                       "pattern": run_options.LABEL_KEY_PATTERN}


_KEYED = {"thread_id": "string", "concurrency_key": "string", "singleton": "object",
          "debounce": "object"}


def _one_key_rule(schema: dict[str, Any]) -> None:
    _keyed_rules(schema, [])


def _keyed_rules(schema: dict[str, Any], starts: list[dict[str, Any]]) -> None:
    # The document says what the validators refuse (generic clients and
    # schemathesis read it).
    schema["not"] = {"anyOf": [
        *starts,
        # A thread, a concurrency key, a singleton or a debounce: one at most.
        *({"required": [a, b], "properties": {a: {"type": _KEYED[a]}, b: {"type": _KEYED[b]}}}
          for i, a in enumerate(_KEYED) for b in list(_KEYED)[i + 1:])]}
    # multitask is a thread's policy: given (not null), it needs a thread_id.
    schema["if"] = {"required": ["multitask"],
                    "properties": {"multitask": {"type": "string"}}}
    schema["then"] = {"required": ["thread_id"],
                      "properties": {"thread_id": {"type": "string"}}}


def _one_start_rule(schema: dict[str, Any]) -> None:
    # run_at and delay_s are each allowed, not both; debounce decides the start.
    _keyed_rules(schema, [
        {"required": ["run_at", "delay_s"],
         "properties": {"run_at": {"type": "string"}, "delay_s": {"type": "number"}}},
        *({"required": ["debounce", start], "properties": {"debounce": {"type": "object"},
                                                           start: {"type": kind}}}
          for start, kind in (("run_at", "string"), ("delay_s", "number")))])
    schema["examples"] = [{"input": {"prompt": "Summarise the incident report"},
                           "labels": {"team": "search"}, "delay_s": 300,
                           "non_retryable_codes": ["invalid_input"]}]


class RunSettings(Strict):
    """What a run is and how it is retried: the fields a submit and a
    schedule's template (api/schedules.py) share."""

    input: dict[str, Any] = Field(description="The agent's input, a JSON object (no NUL "
                                              "character in any of its strings).",
                                  examples=[{"prompt": "Summarise the incident report"}])
    pool: str = Field("default", min_length=1, max_length=bounds.POOL_MAX_CHARS,
                      pattern=POOL_PATTERN)
    priority: Priority = 0
    max_attempts: Attempts | None = None
    budget: BudgetIn | None = None
    backoff_base_s: BackoffBase | None = Field(
        None, description="Seconds before the first retry; each later one waits twice the "
                          f"last, up to backoff_cap_s (default {backoff.BACKOFF_BASE_S}).",
        examples=[10])
    backoff_cap_s: BackoffCap | None = Field(
        None, description="The longest wait between attempts: the n-th retry waits "
                          "min(backoff_cap_s, backoff_base_s * 2^(n-1)) seconds (default "
                          f"{backoff.BACKOFF_CAP_S}; a longer backoff_base_s given alone "
                          "raises it to that).", examples=[600])
    non_retryable_codes: list[ErrorCode] | None = Field(
        None, max_length=backoff.NON_RETRYABLE_MAX,
        description="Error codes after which the run is dead at once, whatever attempts "
                    "remain (a retryable failure with one of them is not retried).",
        examples=[["invalid_input", "quota_exceeded"]])


class SingletonIn(Strict):
    key: str = Field(min_length=1, max_length=bounds.THREAD_MAX_CHARS,
                     pattern=bounds.THREAD_PATTERN, examples=["nightly-sync"])
    on_conflict: Literal["skip", "cancel_in_progress"] = Field(
        "skip", description="`skip`: while a run of the key is pending or active, the submit "
                            "answers it (200); `cancel_in_progress`: that run is cancelled "
                            "and the new one starts.")


class DebounceIn(Strict):
    key: str = Field(min_length=1, max_length=bounds.THREAD_MAX_CHARS,
                     pattern=bounds.THREAD_PATTERN, examples=["user-1234-typing"])
    window_s: float = Field(gt=0, le=24 * 3600, examples=[5],
                            description="The run starts this long after the last submit.")
    max_delay_s: float = Field(gt=0, le=7 * 24 * 3600, examples=[60],
                               description="Never later than this after the first submit "
                                           "(at least window_s).")


class KeyedSettings(RunSettings):
    """A run's thread, concurrency key, singleton or debounce (one at most):
    the fields a submit, a batch item and a schedule's template share."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_one_key_rule)

    thread_id: str | None = Field(
        None, min_length=1, max_length=bounds.THREAD_MAX_CHARS, pattern=bounds.THREAD_PATTERN,
        examples=["conv-42"],
        description="The tenant's thread (a conversation) the run belongs to: at most one run "
                    "of a thread is active at a time, the others wait in submit order. "
                    "Needs no create call; `GET /v1/threads/{id}` shows it.")
    concurrency_key: str | None = Field(
        None, min_length=1, max_length=bounds.THREAD_MAX_CHARS, pattern=bounds.THREAD_PATTERN,
        examples=["user-1234"],
        description="The tenant's concurrency key: the pool's key limits cap how many runs "
                    "of one key run at once (the others wait, parked). Not with `thread_id`.")
    singleton: SingletonIn | None = Field(
        None, description="One run of the key at a time: a submit while one is pending or "
                          "active answers it, or cancels it (`on_conflict`).")
    debounce: DebounceIn | None = Field(
        None, description="Submits of the key within `window_s` of each other make one run "
                          "(the same run id is answered, the last input wins), started at most "
                          "`max_delay_s` after the first. Not with run_at or delay_s.")
    multitask: Literal["enqueue", "reject", "interrupt", "rollback", "steer"] | None = Field(
        None, description="With `thread_id`, when the thread has an unfinished run: "
                          "`enqueue` (default) waits its turn; `reject` answers 409 naming "
                          "the active run; `interrupt` cancels the active run and starts "
                          "after it ended; `rollback` does so and flags it `rolled_back`; "
                          "`steer` makes no run: the input (its `text` or `message`) goes "
                          "into the active run's inbox, and the answer (200) is that run.")

    @model_validator(mode="after")
    def _one_key(self) -> Self:
        if self.multitask is not None and self.thread_id is None:
            raise ValueError("multitask goes with thread_id")  # the schema's if/then
        given = [n for n in ("thread_id", "concurrency_key", "singleton", "debounce")
                 if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of {', '.join(given)}, not several")
        if self.debounce is not None and self.debounce.max_delay_s < self.debounce.window_s:
            raise ValueError("debounce.max_delay_s must be at least its window_s")
        return self


class RunCreate(KeyedSettings):
    """A run to enqueue. Admin callers name the tenant; tenants may not."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_one_start_rule)

    tenant_id: TenantId | None = Field(
        None, description="The tenant the run belongs to. An admin token must name it; a "
                          "tenant token may leave it out or name its own tenant (another "
                          "tenant's is refused with 403).")
    labels: Labels | None = Field(
        None, max_length=run_options.LABELS_MAX,
        description=f"A string map (at most {run_options.LABELS_MAX} labels; keys "
                    f"1-{run_options.LABEL_KEY_MAX_CHARS} characters, values at most "
                    f"{run_options.LABEL_VALUE_MAX_CHARS}) to find runs by "
                    "(`GET /v1/runs?label=key=value`).",
        examples=[{"team": "search", "suite": "nightly-eval"}],
        json_schema_extra=_label_keys)
    run_at: Annotated[AwareDatetime, BeforeValidator(not_a_number)] | None = Field(
        None, description="Not before this time (RFC 3339 with its offset; at most a year "
                          "ahead; a past time means now). Not with `delay_s`.",
        examples=["2026-12-01T09:00:00Z"])
    delay_s: StrictFloat | None = Field(
        None, ge=0, le=run_options.MAX_DELAY_S,
        description="Not before this many seconds from now. Not with `run_at`.",
        examples=[300])

    parent_run_id: UUID | None = Field(
        None, description="Submit the run as a child of this run (the same tenant's, "
                          "not finished): cancelling the parent cancels it.")
    webhook_url: str | None = Field(
        None, min_length=1, max_length=2048, pattern=WEBHOOK_URL_PATTERN,
        examples=["https://hooks.example.com/runlease"],
        description="POSTed a signed notice when the run finishes; its host must be on the "
                    "admin's webhook allowlist.")
    @model_validator(mode="after")
    def _one_start(self) -> Self:
        if self.run_at is not None and self.delay_s is not None:
            raise ValueError("give run_at or delay_s, not both")
        if self.debounce is not None and (self.run_at is not None or self.delay_s is not None):
            raise ValueError("debounce decides the start: not with run_at or delay_s")
        return self


class LeaseInfo(BaseModel):
    """Who holds the run: shown to admins only."""

    locked_by: str
    locked_until: datetime
    lease_epoch: int


class RunUsage(BaseModel):
    """What the run used, every attempt together."""

    input_tokens: int
    output_tokens: int
    cost: float
    turns: int
    tool_calls: int


def described(about: dict[str, dict[str, Any]]) -> ConfigDict:
    """The config of a pydantic dataclass whose fields are declared elsewhere
    (core/): what the OpenAPI document says of those that need saying."""
    def describe(schema: dict[str, Any]) -> None:
        for name, said in about.items():
            schema["properties"][name].update(said)
    return ConfigDict(json_schema_extra=describe)


# The fields are core/run_fields.py's, which the clients' RunView reads
# back; here, the types the API gives them.
@pydantic_dataclass(frozen=True, kw_only=True, config=described({
    "last_event_seq": {"description": "The seq of the run's latest event; 0 if none."},
    "labels": {"description": "The labels given at submit.", "examples": [{"team": "search"}]},
    "backoff_base_s": {"description": "The run's retry policy."},
    "awaiting_children": {"description": "Pending and waiting for its children (holding no "
                                         "worker)."},
}))
class RunOut(RunFields):
    """A run."""

    status: Status
    last_event_seq: int
    lease: LeaseInfo | None = None
    backoff_base_s: int = backoff.BACKOFF_BASE_S
    backoff_cap_s: int = backoff.BACKOFF_CAP_S
    usage: RunUsage | None = None

    @classmethod
    def of(cls, run: Run, *, admin: bool) -> RunOut:
        return cls(**run_out_fields(run, admin=admin))


def run_out_fields(run: Run, *, admin: bool) -> dict[str, Any]:
    """RunOut's fields, in its order, as a plain dict: what RunOut.of would
    hold, for pydantic_core.to_json to render without building models (a
    batch answers with a thousand; tests/unit/test_run_out_json.py checks the
    two render the same text)."""
    lease = None
    if admin and run.locked_by is not None and run.locked_until is not None:
        lease = {"locked_by": run.locked_by, "locked_until": run.locked_until,
                 "lease_epoch": run.lease_epoch}
    return {
        "id": run.id, "pool": run.pool, "tenant_id": run.tenant_id, "status": run.status.value,
        "priority": run.priority, "attempts": run.attempts, "max_attempts": run.max_attempts,
        "input": run.input_json, "budget": run.budget_json, "result": run.result_json,
        "error_code": run.error_code, "error_message": run.error_message,
        "idempotency_key": run.idempotency_key, "cancel_requested_at": run.cancel_requested_at,
        "available_at": run.available_at, "created_at": run.created_at,
        "updated_at": run.updated_at, "finished_at": run.finished_at,
        "last_event_seq": run.event_seq, "lease": lease, "labels": run.labels,
        "backoff_base_s": RetryPolicy(run.backoff_base_s).base_s,
        "backoff_cap_s": RetryPolicy(backoff_cap_s=run.backoff_cap_s).cap_s,
        "non_retryable_codes": run.non_retryable_codes or [],
        "usage": {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens,
                  "cost": float(run.cost), "turns": run.turns_used,
                  "tool_calls": run.tool_calls_used},
        "parent_run_id": run.parent_run_id, "awaiting_children": run.awaiting_children,
        "thread_id": run.thread_id, "rolled_back": run.rolled_back,
        "concurrency_key": run.concurrency_key,
        "messages": {"sent": run.inbox_seq, "taken": run.inbox_read},
        "rerun_of": run.rerun_of,
    }


class RunPage(BaseModel):
    items: list[RunOut]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page.")


def run_json(run: Run, *, admin: bool) -> bytes:
    """RunOut.of(run).model_dump_json(), without building the model."""
    return to_json(run_out_fields(run, admin=admin))


def run_page_json(runs: list[Run], limit: int, *, admin: bool) -> bytes:
    """A RunPage's JSON text, rendered from plain dicts: returned as a model,
    FastAPI would validate every run of the page again before dumping it."""
    return to_json({"items": [run_out_fields(r, admin=admin) for r in runs],
                    "next_cursor": str(runs[-1].id) if len(runs) == limit else None})


class StepOut(BaseModel):
    """A committed durable step: its result as stored (redacted), and the
    attempt and lease epoch that committed it."""

    key: str
    result: Any = None
    attempt: int
    lease_epoch: int
    created_at: datetime

    @classmethod
    def of(cls, step: Step) -> StepOut:
        return cls(key=step.step_key, result=step.result, attempt=step.attempt,
                   lease_epoch=step.lease_epoch, created_at=step.created_at)


class StepPage(BaseModel):
    items: list[StepOut]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page.")


class StreamToken(BaseModel):
    token: str
    expires_at: int = Field(description="Unix time after which the token is refused.")
    url: str = Field(description="The run's event stream, with the token.")


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
