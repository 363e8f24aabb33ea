"""A bulk submit's enqueue (sql/run_batch.sql): up to 1,000 runs in one
statement, each new run answered as JSON text made from what was sent.

The statement returns of a new run only what the database decided (its
max_attempts, when it may start, when it was made); its answer is the
RunOut the store would render from the whole row (api/schemas.run_out_fields:
the same members in the same order, equal values), spliced from the texts
the store checked and sent. Reading the whole rows back (each one's columns
and JSON parsed, then rendered again) was most of a batch's CPU in the API
process, and returning them a sixth of the statement's.
tests/integration/test_run_batch.py compares each answer with the run as
GET /v1/runs/{id} shows it. A run that existed already (a repeated
idempotency key) is read whole and rendered by the caller (it may be
leased, finished...).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast
from uuid import UUID

from psycopg.rows import tuple_row
from pydantic_core import to_json

from runlease.core.backoff import RetryPolicy
from runlease.db.enqueue_explain import enqueue_outcomes
from runlease.db.enqueue_params import refuse
from runlease.db.executor import Conn
from runlease.db.models import Run
from runlease.db.queries import sql
from runlease.db.runs import NewRun, QueueStore
from runlease.errors import BatchRefused, ItemError, RunleaseError

# A number jsonb stores as a decimal and writes back otherwise than the
# text sent: with an exponent (1e+300 comes back as 1 and 300 zeros, which
# reads as an integer), or a negative zero. Such a run's answer is read
# back, as GET shows it. The pattern also matches inside strings: those
# runs are read back for nothing, rarely.
_NORMALIZED = re.compile(r"[0-9][eE]|-0\.0(?![0-9])")

_USAGE = ('"usage":{"input_tokens":0,"output_tokens":0,"cost":0.0,"turns":0,'
          '"tool_calls":0},"parent_run_id":null,"awaiting_children":false,'
          '"thread_id":null,"rolled_back":false,"concurrency_key":null,'
          '"messages":{"sent":0,"taken":0},"rerun_of":null,"title":')


@dataclass
class BatchEnqueued:
    """A batch's outcome, in the order given: each item's answer, a new
    run's JSON text or an existing run (to render), and whether it is new."""

    runs: list[str | Run]
    created: list[bool]
    submitted: Counter[str] = field(default_factory=Counter)  # new runs per pool
    ready: set[str] = field(default_factory=set)  # pools with a new run startable now


class _Texts:
    """The answer's texts a batch repeats, rendered once each."""

    def __init__(self) -> None:
        self.heads: dict[tuple[str, str, int], str] = {}
        self.retries: dict[RetryPolicy, str] = {}
        self.last_time: datetime | None = None
        self.last_text = ""

    def head(self, pool: str, tenant: str, priority: int) -> str:
        text = self.heads.get((pool, tenant, priority))
        if text is None:
            text = self.heads[pool, tenant, priority] = (
                f'"pool":{json.dumps(pool)},"tenant_id":{json.dumps(tenant)},'
                f'"status":"pending","priority":{priority},"attempts":0,"max_attempts":')
        return text

    def retry(self, retry: RetryPolicy) -> str:
        text = self.retries.get(retry)
        if text is None:
            # As run_out_fields shows the stored policy.
            text = self.retries[retry] = (
                f'"backoff_base_s":{RetryPolicy(retry.backoff_base_s).base_s},'
                f'"backoff_cap_s":{RetryPolicy(backoff_cap_s=retry.backoff_cap_s).cap_s},'
                f'"non_retryable_codes":{json.dumps(list(retry.non_retryable_codes or ()))}')
        return text

    def time(self, at: datetime) -> str:
        if at != self.last_time:  # a batch's runs were all made at one instant
            self.last_time, self.last_text = at, to_json(at).decode()
        return self.last_text


class BatchStore(QueueStore):
    async def enqueue_batch(self, pool: str, runs: Sequence[NewRun], *,
                            conn: Conn) -> BatchEnqueued:
        """Enqueue a batch in one INSERT on `conn`, in a transaction of its
        own inside the caller's: all or nothing, refused as enqueue_many
        refuses (BatchRefused naming every refused item by index, a batch of
        one its item's own error). Runs name their pool (None: `pool`)."""
        params, errors = self._enqueue_params(pool, runs)
        if errors:
            raise errors[0][1] if len(runs) == 1 else BatchRefused([
                ItemError(i, "invalid_request", e.field, e.message) for i, e in errors])
        params |= {"notify": False, "now": self.clock.db_now()}
        found: dict[str, Run] = {}
        async with self.connection(conn) as c, c.transaction():
            async with c.cursor(row_factory=tuple_row) as cur:
                await cur.execute(sql("run_enqueue_batch"), params)
                rows = await cur.fetchall()
            outcomes = await self._batch_outcomes(params, rows, c)
            refuse(len(runs), outcomes)  # rolls the batch back
            # Existing runs, and new ones whose input jsonb writes otherwise
            # (see _NORMALIZED), are read whole, in the transaction.
            whole = [UUID(o) for o in outcomes if isinstance(o, str)] + [
                UUID(o[0]) for o, text in zip(outcomes, params["inputs"], strict=True)
                if isinstance(o, tuple) and _NORMALIZED.search(text)]
            if whole:
                found = {str(r["id"]): Run.from_row(r)
                         for r in await self._rows("run_get_many", {"ids": whole}, c)}
        done = BatchEnqueued([], [])
        texts = _Texts()
        for (outcome, run_pool, tenant, priority, key, input_text, budget, labels, retry,
             title) in zip(
                outcomes, params["pools"], params["tenants"], params["priorities"],
                params["keys"], params["inputs"], params["budgets"], params["labels"],
                params["retries"], params["titles"], strict=True):
            if isinstance(outcome, str):
                done.runs.append(found[outcome])
                done.created.append(False)
                continue
            run_id, _, max_attempts, created_at, available_at = outcome[:5]
            created = texts.time(created_at)
            done.created.append(True)
            done.submitted[run_pool] += 1
            if available_at is None:  # startable now
                done.ready.add(run_pool)
            if run_id in found:
                done.runs.append(found[run_id])
                continue
            done.runs.append(
                f'{{"id":"{run_id}",{texts.head(run_pool, tenant, priority)}{max_attempts},'
                f'"input":{input_text},"budget":{budget},"result":null,"error_code":null,'
                f'"error_message":null,"idempotency_key":'
                f'{"null" if key is None else json.dumps(key)},"cancel_requested_at":null,'
                f'"available_at":{created if available_at is None else texts.time(available_at)},'
                f'"created_at":{created},'
                f'"updated_at":{created},"finished_at":null,"last_event_seq":0,"lease":null,'
                f'"labels":{labels or "{}"},{texts.retry(retry)},{_USAGE}'
                f'{"null" if title is None else json.dumps(title)}}}')
        return done

    async def _batch_outcomes(self, params: dict[str, Any], rows: list[tuple[Any, ...]],
                              conn: Conn) -> list[tuple[Any, ...] | str | RunleaseError]:
        """Each valid run's row (new), the id of the run its key names
        (existing), or why the insert returned no row for it."""
        by_id = {r[0]: r for r in rows if r[1]}
        by_key = {(r[5], r[6], r[7]): r[0] for r in rows if not r[1]}

        def found(run_id: Any, pool: str, tenant: str,
                  key: str | None) -> tuple[Any, ...] | str | None:
            row = by_id.get(run_id)
            if row is not None:
                return row
            return by_key.get((pool, tenant, key)) if key is not None else None

        # (mypy joins tuple | str to Sequence when it solves the type variable)
        return cast(list[tuple[Any, ...] | str | RunleaseError],
                    await enqueue_outcomes(self, conn, params, found))
