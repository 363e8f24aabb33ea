"""Humans in the loop and the inbox (statements in sql/humans.sql).

    wait      leased & mine -> waiting (attempt not charged; no lease, no slot)
    answer    waiting for <name> -> pending; step 'input:<name>' = {"value": v}, once
    timeout   waiting past the request's time -> pending; step = {"timed_out": true}
    message   any unfinished run: appended to its inbox; its holder is woken
    take      the agent's k-th take of a message: step 'message:<k>', fenced

An answer is applied once: the run and its request are locked, the request
must be unanswered, and the step is written with the run's move to pending
in one transaction. The same answer again is answered as applied; a
different one is refused (409). A cancel, an answer and a timeout lock the
run first, in that order of arrival, each seeing the other's outcome.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import jsonschema

from runlease.core import bounds
from runlease.core.states import RunStatus
from runlease.db.channels import INBOX_CHANNEL, POOL_CHANNEL_PREFIX
from runlease.db.executor import Conn, Executor, stale_writes
from runlease.db.models import Lease
from runlease.errors import LeaseLost, RunleaseError, RunNotFound, ValidationError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_PROMPT_CHARS = 8192
MAX_SCHEMA_BYTES = 16 * 1024
MAX_VALUE_BYTES = 64 * 1024
MAX_TIMEOUT_S = 30 * 86_400
MAX_INPUTS_LISTED = 200

MAX_MESSAGE_BYTES = 32 * 1024
MAX_UNREAD_MESSAGES = 100
MAX_RUN_MESSAGES = 10_000
MAX_MESSAGES_PAGE = 500


class InputRefused(RunleaseError):
    """An answer that cannot apply: the run is not waiting for that name, or
    the request was answered with another value (a 409), or timed out."""

    def __init__(self, run_id: UUID, name: str, why: str) -> None:
        super().__init__(f"run {run_id} cannot take input {name!r}: {why}")
        self.run_id, self.name, self.why = run_id, name, why


class InboxFull(RunleaseError):
    """A message past the inbox's bounds (a 429: the agent has not taken
    the ones before it, or the run has had its share of messages)."""

    def __init__(self, run_id: UUID, why: str, retry_s: float) -> None:
        super().__init__(f"run {run_id}: {why}")
        self.run_id, self.retry_s = run_id, retry_s


class MessageRefused(RunleaseError):
    """A message to a finished run (a 409)."""

    def __init__(self, run_id: UUID, status: str) -> None:
        super().__init__(f"run {run_id} is {status}: it takes no more messages")
        self.run_id, self.status = run_id, status


@dataclass(frozen=True, slots=True)
class InputRequest:
    """What a run asked a person, and what became of it."""

    run_id: UUID
    name: str
    prompt: str | None
    schema: Any
    requested_at: datetime
    timeout_at: datetime | None
    nonce: str
    answered_at: datetime | None
    outcome: str | None
    value: Any
    answered_by: str | None
    run_status: str

    @property
    def open(self) -> bool:
        """Waiting for an answer now."""
        return self.answered_at is None and self.run_status == RunStatus.WAITING

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "prompt": self.prompt, "schema": self.schema,
                "requested_at": self.requested_at.isoformat(),
                "timeout_at": self.timeout_at.isoformat() if self.timeout_at else None,
                "open": self.open, "outcome": self.outcome,
                "answered_at": self.answered_at.isoformat() if self.answered_at else None,
                "answered_by": self.answered_by, "value": self.value}


def check_input_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValidationError("name", "must be 1-64 characters of letters, digits, '.', '_' "
                                      "and '-', starting with a letter or digit")
    return name


def check_schema(schema: object) -> Any:
    """A JSON schema for an answer: a JSON object, bounded, that is itself a
    valid schema (its draft's meta-schema). No $ref may leave the schema:
    the validator would not fetch it, and a schema is the tenant's input."""
    if schema is None:
        return None
    if not isinstance(schema, dict):
        raise ValidationError("schema", "must be a JSON object (a JSON schema)")
    text = bounds.json_text("schema", schema, MAX_SCHEMA_BYTES)
    if '"$ref"' in text and re.search(r'"\$ref"\s*:\s*"(?!#)', text):
        raise ValidationError("schema", "a $ref must point inside the schema (start with #)")
    if re.search(r'"(pattern|patternProperties|\$dynamicRef|\$recursiveRef)"\s*:', text):
        # A regular expression of the tenant's, run by the API on another
        # input of the tenant's, can take the process for minutes (ReDoS):
        # answers are checked by type, enum, bounds and structure only.
        raise ValidationError("schema", "pattern, patternProperties and dynamic references "
                                        "are not supported in input schemas")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValidationError("schema", f"is not a valid JSON schema: {exc.message}") from None
    return schema


def check_value(schema: Any, value: Any) -> None:
    """The answer against the request's schema (ValidationError naming the
    first failure). A schema that cannot be evaluated is the request's
    fault, reported as such: never a 500."""
    bounds.json_text("value", value, MAX_VALUE_BYTES)
    if schema is None:
        return
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except Exception as exc:
        raise ValidationError("value", f"the request's schema cannot be applied: {exc}") \
            from None
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "value"
        raise ValidationError("value", f"{where}: {error.message[:300]}")


def free_text(schema: Any) -> bool:
    """A request a chat message may answer: no schema, or a string."""
    return schema is None or (isinstance(schema, dict) and schema.get("type") == "string"
                              and set(schema) <= {"type", "title", "description",
                                                  "minLength", "maxLength"})


class HumanStore(Executor):
    # -- the worker's side ---------------------------------------------------------

    async def wait_input(self, lease: Lease, name: str, *, prompt: str | None,
                         schema: Any, timeout_s: float | None,
                         conn: Conn | None = None) -> RunStatus:
        """The attempt ends waiting for input `name` (see the module doc);
        returns where the run went: waiting, or cancelled (a Stop came first)."""
        check_input_name(name)
        if prompt is not None:
            prompt = self.redactor.text(str(prompt))[:MAX_PROMPT_CHARS]
        schema_text = (bounds.json_text("schema", check_schema(schema), MAX_SCHEMA_BYTES)
                       if schema is not None else None)
        if timeout_s is not None and not 1 <= timeout_s <= MAX_TIMEOUT_S:
            raise ValidationError("timeout_s", f"must be between 1 and {MAX_TIMEOUT_S}")
        rows = await self._fenced("run_wait_input", lease, {
            "name": name, "prompt": prompt, "schema": schema_text,
            "timeout_s": timeout_s, "nonce": secrets.token_urlsafe(24)}, conn)
        return RunStatus(rows[0]["status"])

    async def take_message(self, lease: Lease, seq: int, *,
                           conn: Conn | None = None) -> dict[str, Any] | None:
        """Message `seq` of the run's inbox, taken as the step 'message:<seq>'
        (fenced); None while there is no such message. LeaseLost when the
        lease is gone."""
        params = {"id": lease.run_id, "epoch": lease.epoch, "worker": lease.worker,
                  "seq": seq}
        rows = await self._rows("run_message_take", params, conn)
        if not rows:
            return None
        if not rows[0]["taken"]:
            stale_writes(lease.run.pool)
            raise LeaseLost(lease.run_id, lease.epoch)
        message: dict[str, Any] = rows[0]["message"]
        return message

    async def inbox_state(self, run_id: UUID, *, tenant_id: str | None = None,
                          conn: Conn | None = None) -> tuple[str, int, int] | None:
        """(status, messages sent, messages taken) of a run, or None."""
        rows = await self._rows("run_inbox_state", {"id": run_id, "tenant": tenant_id}, conn)
        if not rows:
            return None
        r = rows[0]
        return r["status"], int(r["inbox_seq"]), int(r["inbox_read"])

    # -- the API's side --------------------------------------------------------------

    async def give_input(self, run_id: UUID, name: str, value: Any, *,
                         tenant_id: str | None = None, by: str = "api",
                         nonce: str | None = None, conn: Conn | None = None) -> bool:
        """Answer the run's request `name` with `value` (validated against the
        request's schema). True: this answer resumed the run; False: the same
        answer was applied before (a repeat, answered as success). RunNotFound
        (another tenant's run too), InputRefused (not asked, answered with
        another value, timed out, the run not waiting), ValidationError (the
        schema). `nonce`: a resume URL's, which must name this very request."""
        check_input_name(name)
        value_text = bounds.json_text("value", value, MAX_VALUE_BYTES, self.redactor.json)
        async with self.connection(conn) as c, c.transaction():
            runs = await self._rows("run_input_lock", {"id": run_id, "tenant": tenant_id}, c)
            if not runs:
                raise RunNotFound(run_id)
            rows = await self._rows("run_input_get", {"id": run_id, "name": name}, c)
            if not rows:
                raise InputRefused(run_id, name, "the run never asked for it")
            row = {**rows[0], "status": runs[0]["status"]}
            if nonce is not None and not secrets.compare_digest(nonce, row["nonce"]):
                raise InputRefused(run_id, name, "the link is not this request's")
            if row["answered_at"] is not None:
                if row["outcome"] == "answered" and nonce is None and \
                        _same_json(row["value"], self.redactor.json(value)):
                    return False
                raise InputRefused(run_id, name, {
                    "answered": "it was answered already" + (
                        "" if nonce is None else " (a resume link works once)"),
                    "timed_out": "the request timed out",
                    "closed": "the run ended first"}.get(row["outcome"], "it is closed"))
            if row["status"] != RunStatus.WAITING:
                raise InputRefused(run_id, name, f"the run is {row['status']}, not waiting")
            check_value(row["schema"], value)
            done = await self._rows("run_input_answer", {
                "id": run_id, "name": name, "value": value_text, "by": by,
                "channel_prefix": POOL_CHANNEL_PREFIX}, c)
            if not done:  # cannot happen under the run's lock; refuse rather than guess
                raise InputRefused(run_id, name, "the run is no longer waiting")
            return True

    async def input_requests(self, run_id: UUID, *, tenant_id: str | None = None,
                             conn: Conn | None = None) -> list[InputRequest]:
        rows = await self._rows("run_inputs_list", {"id": run_id, "tenant": tenant_id,
                                                    "limit": MAX_INPUTS_LISTED}, conn)
        return [InputRequest(**dict(r)) for r in rows]

    async def time_out_inputs(self, *, batch: int = 1000,
                              conn: Conn | None = None) -> list[tuple[UUID, str, str, str]]:
        """Requests whose time is up, one bounded batch (the reaper's leader):
        (run id, pool, tenant, name) of each run it sent back to pending."""
        rows = await self._rows("run_input_timeouts", {
            "batch": batch, "channel_prefix": POOL_CHANNEL_PREFIX}, conn)
        return [(r["id"], r["pool"], r["tenant_id"], r["name"]) for r in rows]

    async def send_message(self, run_id: UUID, text: str, data: Any = None, *,
                           tenant_id: str | None = None,
                           conn: Conn | None = None) -> tuple[int, str]:
        """Append a message (redacted, bounded) to an unfinished run's inbox;
        (its seq, the run's status). RunNotFound, MessageRefused (finished),
        InboxFull (a 429)."""
        if not isinstance(text, str):
            raise ValidationError("text", "must be a string")
        body: dict[str, Any] = {"text": text}
        if data is not None:
            if not isinstance(data, dict):
                raise ValidationError("data", "must be a JSON object")
            body["data"] = data
        body_text = bounds.json_text("message", body, MAX_MESSAGE_BYTES, self.redactor.json)
        rows = await self._rows("run_message_add", {
            "id": run_id, "tenant": tenant_id, "body": body_text,
            "max_unread": MAX_UNREAD_MESSAGES, "max_total": MAX_RUN_MESSAGES,
            "channel": INBOX_CHANNEL}, conn)
        if rows:
            return int(rows[0]["seq"]), str(rows[0]["status"])
        state = await self.inbox_state(run_id, tenant_id=tenant_id, conn=conn)
        if state is None:
            raise RunNotFound(run_id)
        status, sent, taken = state
        if status not in (RunStatus.PENDING, RunStatus.LEASED, RunStatus.WAITING):
            raise MessageRefused(run_id, status)
        if sent >= MAX_RUN_MESSAGES:
            raise InboxFull(run_id, f"a run takes at most {MAX_RUN_MESSAGES} messages",
                            3600.0)
        raise InboxFull(run_id, f"{sent - taken} messages wait for the agent to take them "
                                f"(at most {MAX_UNREAD_MESSAGES})", 5.0)

    async def messages(self, run_id: UUID, *, tenant_id: str | None = None, after: int = 0,
                       limit: int = 100, conn: Conn | None = None) -> list[dict[str, Any]]:
        if not 1 <= limit <= MAX_MESSAGES_PAGE:
            raise ValidationError("limit", f"must be between 1 and {MAX_MESSAGES_PAGE}")
        rows = await self._rows("run_messages_list", {
            "id": run_id, "tenant": tenant_id, "after": max(0, after), "limit": limit}, conn)
        return [{"seq": r["seq"], **r["body"], "sent_at": r["created_at"].isoformat(),
                 "taken": r["taken"]} for r in rows]

    async def server_key(self, name: str, *, conn: Conn | None = None) -> str:
        """The server's own secret `name`, made once for every replica."""
        for _ in range(3):
            rows = await self._rows("server_key_get", {
                "name": name, "secret": secrets.token_urlsafe(48)}, conn)
            if rows:
                return str(rows[0]["secret"])
        raise RunleaseError(f"server key {name!r} could not be read")


def _same_json(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
