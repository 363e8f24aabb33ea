"""The enqueue statement's parameters (sql/runs.sql, run_enqueue): a batch's
runs checked and written as one JSON array, and the refusal of a batch."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from runlease.core import bounds, run_options
from runlease.core.backoff import RetryPolicy
from runlease.core.ids import uuid7_texts
from runlease.db.channels import POOL_CHANNEL_PREFIX
from runlease.errors import (
    BatchConflict,
    BatchRefused,
    IdempotencyConflict,
    ItemError,
    RunleaseError,
    UnknownPool,
    ValidationError,
)
from runlease.tracing import parse_traceparent

if TYPE_CHECKING:
    from runlease.db.runs import NewRun


def _set(name: str, value: object) -> str:
    # A member only when it is set: jsonb_to_recordset reads a missing one
    # as NULL, and every member is parsed and looked up again in the
    # statement (a run with all of them was twice as long to send and read).
    return "" if value is None else f',"{name}":{json.dumps(value)}'


def _retry_text(retry: RetryPolicy) -> str:
    return (_set("backoff_base_s", retry.backoff_base_s)
            + _set("backoff_cap_s", retry.backoff_cap_s)
            + _set("non_retryable_codes", retry.non_retryable_codes))


_DEFAULT_RETRY = (RetryPolicy(), _retry_text(RetryPolicy()))


def refuse(n_runs: int, outcomes: Sequence[object]) -> None:
    """Raises what refuses a batch of n_runs whose valid runs' outcomes
    (a result, or the error of a run the insert returned no row for) are
    these, if any is an error: a single run's own error, or every refused
    item by index. Raised inside the transaction, it rolls the batch back."""
    refused: list[ItemError] = []
    conflicts: list[IdempotencyConflict] = []
    for i, outcome in enumerate(outcomes):
        if not isinstance(outcome, RunleaseError):
            continue
        if n_runs == 1:
            raise outcome
        if isinstance(outcome, IdempotencyConflict):
            conflicts.append(outcome)
            refused.append(ItemError(i, "idempotency_conflict", "idempotency_key",
                                     str(outcome)))
        else:
            assert isinstance(outcome, ValidationError)
            code = "unknown_pool" if isinstance(outcome, UnknownPool) else "invalid_request"
            refused.append(ItemError(i, code, outcome.field, outcome.message))
    if refused:
        if conflicts and len(conflicts) == len(refused):
            raise BatchConflict(refused, conflicts[0])
        raise BatchRefused(refused)


class _Checks:
    """A batch's runs mostly share their pool, tenant, priority, attempts,
    retry policy and labels: each distinct value is checked (and its text
    dumped) once. The checks are pure, so an item's first failure is still
    the one its own checks, in order, would raise."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.heads: dict[tuple[Any, ...], tuple[str, str, int, str]] = {}
        self.retries: dict[RetryPolicy | None, tuple[RetryPolicy, str]] = {
            None: _DEFAULT_RETRY}
        self.labels: dict[tuple[tuple[Any, Any], ...] | None, str | None] = {}

    def head(self, run: NewRun) -> tuple[str, str, int, str]:
        """The run's pool, tenant and priority as checked, and their text."""
        memo = (run.pool, run.tenant_id, run.priority, run.max_attempts, type(run.pool),
                type(run.tenant_id), type(run.priority), type(run.max_attempts))
        try:
            checked = self.heads.get(memo)
        except TypeError:  # an unhashable value: refused below
            checked = None
        if checked is None:
            run_pool = self.pool if run.pool is None else bounds.check_pool(run.pool)
            tenant = bounds.check_tenant(run.tenant_id)
            priority = bounds.check_priority(run.priority)
            attempts = (None if run.max_attempts is None
                        else bounds.check_max_attempts(run.max_attempts))
            checked = self.heads[memo] = (
                run_pool, tenant, priority,
                f'"pool":{json.dumps(run_pool)},"tenant_id":{json.dumps(tenant)},'
                f'"priority":{priority}{_set("max_attempts", attempts)}')
        return checked

    def label_text(self, run: NewRun) -> str | None:
        seen = None
        try:
            seen = None if run.labels is None else tuple(run.labels.items())
            return self.labels[seen]
        except (KeyError, TypeError, AttributeError):
            labels = run_options.check_labels(run.labels)
            if seen is not None:
                self.labels[seen] = labels
            return labels

    def retry(self, run: NewRun) -> tuple[RetryPolicy, str]:
        try:
            return self.retries[run.retry]
        except (KeyError, TypeError):
            assert run.retry is not None
            retry = RetryPolicy.checked(run.retry.backoff_base_s, run.retry.backoff_cap_s,
                                        run.retry.non_retryable_codes)
            checked = (retry, _retry_text(retry))
            with contextlib.suppress(TypeError):
                self.retries[run.retry] = checked
            return checked


def enqueue_params(pool: str, runs: Sequence[NewRun], now: datetime, max_input_bytes: int
                   ) -> tuple[dict[str, Any], list[tuple[int, ValidationError]]]:
    """The statement's parameters: the runs as one JSON array (values
    validated, texts spliced in as checked), and what was refused. Per
    valid run, in parallel lists, what it was checked as (ids as text, pools,
    tenants, priorities, keys; the texts of its input, budget and labels,
    and its retry policy: what db/enqueue_batch.py answers with)."""
    cols: dict[str, list[Any]] = {k: [] for k in (
        "ids", "pools", "tenants", "priorities", "keys", "inputs", "budgets", "labels",
        "retries")}
    docs: list[str] = []
    errors: list[tuple[int, ValidationError]] = []
    seen_keys: set[tuple[str, str, str]] = set()
    checks = _Checks(pool)
    ids = uuid7_texts(len(runs))
    for i, run in enumerate(runs):
        try:
            run_pool, tenant, priority, head = checks.head(run)
            budget = (bounds.json_text("budget", bounds.Budget.parse(run.budget).to_json(),
                                       max_input_bytes)
                      if run.budget is not None else "{}")
            input_text = (bounds.check_parsed_object if run.input_parsed
                          else bounds.check_object)("input", run.input, max_input_bytes)
            labels = checks.label_text(run)
            run_at, delay_s = ((None, None) if run.run_at is None and run.delay_s is None
                               else run_options.check_start(run.run_at, run.delay_s, now))
            key = run.idempotency_key
            if key is not None:
                bounds.check_idempotency_key(key)
                if (run_pool, tenant, key) in seen_keys:
                    raise ValidationError("idempotency_key", "repeated within one batch")
                seen_keys.add((run_pool, tenant, key))
            retry, retry_text = checks.retry(run)
        except ValidationError as exc:
            errors.append((i, ValidationError(exc.field, exc.message)
                           if len(runs) == 1 else exc))
            continue
        run_id = ids[i]
        doc = (f'{{"ord":{i},"id":"{run_id}",{head}{retry_text},'
               f'"budget_json":{budget},"input_json":{input_text}')
        if labels is not None:
            doc += f',"labels":{labels}'
        if run.traceparent is not None:
            # Checked again here: whatever reaches the store is W3C or dropped.
            doc += _set("traceparent", parse_traceparent(run.traceparent))
        if key is not None or run_at is not None or delay_s is not None:
            doc += (_set("idempotency_key", key)
                    + _set("run_at", None if run_at is None else run_at.isoformat())
                    + _set("delay_s", delay_s))
        docs.append(doc + "}")
        for column, value in zip(cols.values(), (
                run_id, run_pool, tenant, priority, key, input_text, budget, labels, retry),
                strict=True):
            column.append(value)
    return {**cols, "runs": "[" + ",".join(docs) + "]",
            "channel_prefix": POOL_CHANNEL_PREFIX}, errors
