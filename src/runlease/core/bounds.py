"""Input bounds, checked before anything is written.

Each check raises `ValidationError` naming the field, so the API can answer
with a 4xx that says which part of the request is wrong. The same checks run
in the store (for library users) and in the API (for HTTP users).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json

from runlease.errors import ValidationError

DEFAULT_MAX_INPUT_BYTES = 256 * 1024
MAX_EVENT_BYTES = 64 * 1024
MAX_STEP_RESULT_BYTES = 1024 * 1024
MAX_ERROR_MESSAGE_CHARS = 4096
RETRY_AFTER_MAX_S = 24 * 3600

PRIORITY_MIN, PRIORITY_MAX = -100, 100
MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX = 1, 100
LEASE_S_MIN, LEASE_S_MAX = 1, 3600
AGING_S_MAX = 7 * 24 * 3600
MAX_IN_FLIGHT_MAX = 1_000_000
TENANT_MAX_CHARS = 128
KEY_MAX_CHARS = 255
POOL_MAX_CHARS = 48
# A thread id (issue 27): tenant-scoped, a path segment of /v1/threads/{id};
# agent_runs' and agent_run_threads' CHECKs say the same (migration 0017).
THREAD_MAX_CHARS = 128
THREAD_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
# A key limit's name (migration 0021): a key, or a pattern where `*` stands
# for any characters ("user-*"); agent_run_key_limits' CHECK says the same.
KEY_PATTERN_PATTERN = r"^[A-Za-z0-9*][A-Za-z0-9._:@*-]{0,127}$"
# A run's title (issue 29): a line of text, shown by the console's runs list;
# agent_runs' CHECK says the same (migration 0020).
TITLE_MAX_CHARS = 200
TITLE_PATTERN = r"^[^\x00-\x1f\x7f]+$"

# Pool names become part of a NOTIFY channel name (63 bytes at most) and follow
# Kubernetes naming, since a pool is usually an AgentRunPool's metadata.name.
# The one definition: the API, the CRD and agent_run_pools' CHECK use it too
# (tests/unit/test_constants.py checks that the last two agree).
POOL_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$"
_POOL_RE = re.compile(POOL_PATTERN)
_THREAD_RE = re.compile(THREAD_PATTERN.replace("$", r"\Z"))
_KEY_PATTERN_RE = re.compile(KEY_PATTERN_PATTERN.replace("$", r"\Z"))
_PRINTABLE_RE = re.compile(r"^[^\x00-\x20\x7f]+$")
_TITLE_RE = re.compile(TITLE_PATTERN.replace("$", r"\Z"))
_EVENT_KIND_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
_ERROR_CODE_RE = _EVENT_KIND_RE
INVALID_ERROR_CODE = "invalid_error_code"
# A JSON escape of NUL: backslash-u0000 not itself preceded by an escaped
# backslash (the text "\\u0000" in a string is an escaped backslash, then "u0000").
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# Nesting bound of every JSON value stored (inputs, results, steps, events,
# templates): pydantic-core, which reads jsonb columns back and writes the
# API's answers, refuses values nested over about 200 levels, so a deeper one
# stored would answer every later read of the run with an error.
MAX_JSON_DEPTH = 100
_SEQUENCES = (list, tuple)
_CONTAINERS = (dict, list, tuple)


def _int(field: str, value: object, lo: int, hi: int) -> int:
    # bool is an int in Python but never a sensible priority or count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, f"must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValidationError(field, f"must be between {lo} and {hi}, got {value}")
    return value


def _text(field: str, value: object, max_chars: int, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise ValidationError(field, "must not be empty")
    if len(value) > max_chars:
        raise ValidationError(field, f"must be at most {max_chars} characters, got {len(value)}")
    if not pattern.match(value):
        raise ValidationError(field, f"has characters that are not allowed: {value[:40]!r}")
    return value


# Not a tenant: the console's session names admin `*` (issue 32: a tenant
# named so signed in to the console as admin), and `*` reads as "every".
RESERVED_TENANTS = frozenset({"*"})


def check_tenant(value: object) -> str:
    tenant = _text("tenant_id", value, TENANT_MAX_CHARS, _PRINTABLE_RE)
    if tenant in RESERVED_TENANTS:
        raise ValidationError("tenant_id", f"{tenant!r} is reserved, not a tenant")
    return tenant


def check_thread(value: object) -> str:
    return _text("thread_id", value, THREAD_MAX_CHARS, _THREAD_RE)


def check_key(field: str, value: object) -> str:
    """A concurrency key: a thread id's rules (issue 27)."""
    return _text(field, value, THREAD_MAX_CHARS, _THREAD_RE)


def check_key_pattern(field: str, value: object) -> str:
    """A key limit's name: a key, or a pattern with `*` (any characters) and
    at least one other character (`*` alone is the pool's default)."""
    name = _text(field, value, THREAD_MAX_CHARS, _KEY_PATTERN_RE)
    if not name.strip("*"):
        raise ValidationError(field, "a pattern needs a character besides '*' (the "
                                     "default limit is every key's)")
    return name


def check_pool(value: object) -> str:
    if isinstance(value, str) and len(value) > POOL_MAX_CHARS:
        raise ValidationError(
            "pool", f"must be at most {POOL_MAX_CHARS} characters, got {len(value)}"
        )
    if isinstance(value, str) and value and not _POOL_RE.match(value):
        raise ValidationError(
            "pool", "must be lowercase letters, digits and '-', starting and ending alphanumeric"
        )
    return _text("pool", value, POOL_MAX_CHARS, _POOL_RE)


def check_title(value: object) -> str:
    """A run's title: one line (no control character), 1-200 characters."""
    title = _text("title", value, TITLE_MAX_CHARS, _TITLE_RE)
    try:
        title.encode()
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 for it
        raise ValidationError("title", "has a character that is not valid Unicode") from None
    return title


def check_idempotency_key(value: object) -> str:
    return _text("idempotency_key", value, KEY_MAX_CHARS, _PRINTABLE_RE)


def check_priority(value: object) -> int:
    return _int("priority", value, PRIORITY_MIN, PRIORITY_MAX)


def check_max_attempts(value: object) -> int:
    return _int("max_attempts", value, MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX)


def check_lease_s(value: object) -> int:
    return _int("lease_s", value, LEASE_S_MIN, LEASE_S_MAX)


def check_max_in_flight(field: str, value: object) -> int:
    return _int(field, value, 0, MAX_IN_FLIGHT_MAX)


def check_aging_s(value: object) -> int:
    return _int("priority_aging_s", value, 0, AGING_S_MAX)


RETENTION_S_MAX = 10 * 365 * 24 * 3600
TOOL_ENV_MAX = 64
_ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
# The worker's own credentials: a pool must not hand them to tools. libpq
# reads PG* variables (PGPASSWORD, PGSERVICEFILE, ...) as connection settings.
_WORKER_ENV_RE = re.compile(r"^(RUNLEASE_|PG)|^DATABASE_URL$")


def check_retention_s(value: object) -> int:
    return _int("retention_s", value, 0, RETENTION_S_MAX)


def check_tool_env(value: object) -> tuple[str, ...]:
    """Names of environment variables a pool grants its tools, checked."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ValidationError("tool_env", "must be a list of environment variable names")
    if len(value) > TOOL_ENV_MAX:
        raise ValidationError("tool_env", f"must name at most {TOOL_ENV_MAX} variables, "
                                          f"got {len(value)}")
    names: list[str] = []
    for i, name in enumerate(value):
        field = f"tool_env[{i}]"
        if not isinstance(name, str):
            raise ValidationError(field, f"must be a string, got {type(name).__name__}")
        if not _ENV_NAME_RE.match(name):
            raise ValidationError(field, "must match ^[A-Z_][A-Z0-9_]*$ (at most 128 "
                                         f"characters), got {name[:40]!r}")
        if _WORKER_ENV_RE.search(name):
            raise ValidationError(field, f"{name} is the worker's own (RUNLEASE_*, "
                                         "DATABASE_URL and PG* are never given to tools)")
        if name in names:
            raise ValidationError(field, f"names {name} twice")
        names.append(name)
    return tuple(names)


def check_priority_band(lo: object, hi: object) -> tuple[int | None, int | None]:
    low = None if lo is None else _int("priority_min", lo, PRIORITY_MIN, PRIORITY_MAX)
    high = None if hi is None else _int("priority_max", hi, PRIORITY_MIN, PRIORITY_MAX)
    if low is not None and high is not None and low > high:
        raise ValidationError("priority_min", f"must not exceed priority_max ({low} > {high})")
    return low, high


class NotJson(ValidationError):
    """A value JSON (or jsonb) cannot hold."""


class TooLarge(ValidationError):
    """A value over its size bound."""


def nested_deeper_than(value: object, text: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a JSON value (`text` its JSON) nests objects and arrays over
    `limit` levels. A text with few brackets is answered by counting them;
    otherwise the value is walked a level at a time (no recursion: a value
    nested thousands deep is answered, not a RecursionError)."""
    if text.count(b"{") + text.count(b"[") <= limit:
        return False
    level = [value]
    for _ in range(limit):
        inner: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                inner.extend(x for x in v.values() if isinstance(x, _CONTAINERS))
            elif isinstance(v, _SEQUENCES):
                inner.extend(x for x in v if isinstance(x, _CONTAINERS))
        if not inner:
            return False
        level = inner
    return True


def json_text(field: str, value: object, max_bytes: int,
              redact: Callable[[Any], Any] | None = None) -> str:
    """Serialize to the JSON text that will be stored (after `redact`, if
    given), enforcing the size and the nesting bounds.

    PostgreSQL's jsonb rejects NaN/Infinity and the NUL character, so those are
    refused here with a field name instead of surfacing as a database error.
    """
    try:
        if redact is not None:
            value = redact(value)
        text = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise NotJson(field, f"is not representable as JSON: {exc}") from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise NotJson(field, "must not contain the NUL character")
    try:
        raw = text.encode()
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 for it, nor for jsonb
        raise NotJson(field, "has a character that is not valid Unicode") from None
    if len(raw) > max_bytes:
        raise TooLarge(field, f"is {len(raw)} bytes, over the bound of {max_bytes} bytes")
    _check_depth(field, value, raw)
    return text


def _check_depth(field: str, value: object, raw: bytes) -> None:
    if nested_deeper_than(value, raw):
        raise NotJson(field, f"nests objects and arrays over {MAX_JSON_DEPTH} levels deep")


def check_object(field: str, value: object, max_bytes: int) -> str:
    if not isinstance(value, Mapping):
        raise ValidationError(field, f"must be a JSON object, got {type(value).__name__}")
    return json_text(field, dict(value), max_bytes)


def check_parsed_object(field: str, value: object, max_bytes: int) -> str:
    """check_object for a value parsed from JSON text (only JSON's types in
    it): the same value in the same bound, written by pydantic-core (a tenth
    of json.dumps's time). Its text may differ from json.dumps's only in how
    a float is written (0.000015 for 1.5e-05; json.dumps's at most a quarter
    longer), so what is under half the bound is under it either way;
    anything else (longer, NaN or Infinity, a lone surrogate, a NUL) is
    checked as check_object does."""
    if type(value) is dict:
        try:
            raw = to_json(value)
        except Exception:  # check_object below names what is wrong
            raw = None
        if (raw is not None and len(raw) <= max_bytes // 2 and b"NaN" not in raw
                and b"Infinity" not in raw and b"\\u0000" not in raw):
            _check_depth(field, value, raw)
            return raw.decode()
    return check_object(field, value, max_bytes)


def check_event_kind(value: object) -> str:
    if not isinstance(value, str) or not _EVENT_KIND_RE.match(value):
        raise ValidationError(
            "kind", "must be 1-64 characters: a lowercase letter, then letters, digits, _ . -"
        )
    return value


def error_code(code: object, message: str) -> tuple[str, str]:
    """An agent's error code as stored: kept when it is a code (1-64
    characters: a-z, digits, _ . -), else `invalid_error_code` with the
    original named in the message. Never raises: an odd code from agent code
    must end its run with a clear error, not fail the write that ends it."""
    if isinstance(code, str) and _ERROR_CODE_RE.match(code):
        return code, message
    shown = repr(code)[:80]
    return INVALID_ERROR_CODE, f"(the agent's error code {shown} is not a valid code) {message}"


class ResultRefused(ValidationError):
    """A run's result (or a step's) that cannot be stored; `code` says why."""

    def __init__(self, field: str, message: str, code: str) -> None:
        super().__init__(field, message)
        self.code = code


def result_text(field: str, value: object, max_bytes: int,
                redact: Callable[[Any], Any] | None = None) -> str:
    """json_text for a result: refusals carry result_not_json or result_too_large."""
    try:
        return json_text(field, value, max_bytes, redact)
    except TooLarge as exc:
        raise ResultRefused(field, exc.message, "result_too_large") from None
    except ValidationError as exc:
        raise ResultRefused(field, exc.message, "result_not_json") from None


def check_step_key(value: object) -> str:
    return _text("step_key", value, KEY_MAX_CHARS, re.compile(r"^[^\x00]+$"))


SUBMITS_PER_MINUTE_MAX = 100_000
# A tenant's quota of waiting runs in a pool (issue 32): the default a pool
# has, and the most one may be set to.
DEFAULT_MAX_PENDING = 100_000
MAX_PENDING_MAX = 100_000_000
TOKENS_PER_MINUTE_MAX = 10**12
MAX_TOKENS_MAX = 10**12
MAX_COST_MAX = 1e9
USAGE_TOKENS_MAX = 10**9  # in one record_usage
USAGE_COST_MAX = 1e6


def _number(field: str, value: object, hi: float, *, positive: bool) -> float:
    """A finite JSON number in (0, hi] (positive) or [0, hi]; never a bool or NaN."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, "must be a number")
    if not math.isfinite(value) or not (value > 0 if positive else value >= 0) or value > hi:
        raise ValidationError(field, f"must be {'>' if positive else '>='} 0 and at most {hi:g}")
    return float(value)


def check_rates(submits_per_minute: object, tokens_per_minute: object) -> None:
    """A tenant's rates in a pool: None (no rate) or a positive whole number."""
    if submits_per_minute is not None:
        _int("submits_per_minute", submits_per_minute, 1, SUBMITS_PER_MINUTE_MAX)
    if tokens_per_minute is not None:
        _int("tokens_per_minute", tokens_per_minute, 1, TOKENS_PER_MINUTE_MAX)


def check_usage(input_tokens: object, output_tokens: object, cost: object) -> tuple[int, int,
                                                                                  float]:
    """One usage report of an agent: whole non-negative token counts and a
    finite non-negative cost, each bounded (model output is hostile)."""
    return (_int("input_tokens", input_tokens, 0, USAGE_TOKENS_MAX),
            _int("output_tokens", output_tokens, 0, USAGE_TOKENS_MAX),
            _number("cost", cost, USAGE_COST_MAX, positive=False))


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits one run may use across all its attempts; enforced by the
    worker (worker/budget.py). deadline_s is wall time since submit."""

    max_turns: int | None = None
    max_tool_calls: int | None = None
    deadline_s: float | None = None
    max_tokens: int | None = None
    max_cost: float | None = None

    FIELDS = ("max_turns", "max_tool_calls", "deadline_s", "max_tokens", "max_cost")

    @classmethod
    def parse(cls, value: object) -> Budget:
        if value is None or value == {}:  # most runs: no budget (a worker parses one per run)
            return _NO_BUDGET
        if not isinstance(value, Mapping):
            raise ValidationError("budget", f"must be a JSON object, got {type(value).__name__}")
        unknown = sorted(set(value) - set(cls.FIELDS))
        if unknown:
            raise ValidationError(
                f"budget.{unknown[0]}", f"unknown budget field; known: {', '.join(cls.FIELDS)}"
            )
        turns = value.get("max_turns")
        tools = value.get("max_tool_calls")
        deadline = value.get("deadline_s")
        tokens = value.get("max_tokens")
        cost = value.get("max_cost")
        if turns is not None:
            _int("budget.max_turns", turns, 1, 100_000)
        if tools is not None:
            _int("budget.max_tool_calls", tools, 0, 1_000_000)
        if deadline is not None:
            if isinstance(deadline, bool) or not isinstance(deadline, int | float):
                raise ValidationError("budget.deadline_s", "must be a number of seconds")
            if not math.isfinite(deadline) or not 0 < deadline <= 30 * 24 * 3600:
                raise ValidationError("budget.deadline_s", "must be > 0 and at most 30 days")
        if tokens is not None:
            _int("budget.max_tokens", tokens, 1, MAX_TOKENS_MAX)
        if cost is not None:
            _number("budget.max_cost", cost, MAX_COST_MAX, positive=True)
        return cls(max_turns=turns, max_tool_calls=tools, deadline_s=deadline,
                   max_tokens=tokens, max_cost=cost)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.FIELDS if getattr(self, k) is not None}


_NO_BUDGET = Budget()
