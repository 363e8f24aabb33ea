"""schemathesis hooks (loaded through SCHEMATHESIS_HOOKS by
tests/integration/test_api_contract.py): leave out the generated bodies that
break a rule JSON Schema cannot state, each documented in the field's
description and refused by the server with a 422 that names the field.

- A run's `input` holds no NUL character in any string (PostgreSQL's jsonb
  cannot store one), at any depth: a schema would need a recursive
  definition, which generators do not follow.
- A priority band has `min` <= `max`: a rule between two fields.
- A batch's runs name pools that exist (a pool is data: a batch naming an
  unknown one is refused whole with a 422 naming each such item).
- A debounce's `max_delay_s` is at least its `window_s`: a rule between two fields.
- A run's `run_at` is at most 366 days ahead (of now, which a schema
  cannot name).
- A usage report spans at most 366 days, `from` not after `to` (default
  today): a rule between two parameters and now.
- A schedule's cron expression names a time that exists (the schema gives
  each field's grammar and range; `0 0 31 2 *` fits them and never ticks),
  and its ranges run low to high.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import schemathesis

from runlease.core.cron import Cron
from runlease.errors import ValidationError


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _inverted_band(body: dict[str, Any]) -> bool:
    bands = body.get("tenant_priority")
    if not isinstance(bands, dict):
        return False
    return any(isinstance(b, dict) and isinstance(b.get("min"), int | float)
               and isinstance(b.get("max"), int | float) and b["min"] > b["max"]
               for b in bands.values())


def _far_run_at(body: dict[str, Any]) -> bool:
    items = body.get("runs") if isinstance(body.get("runs"), list) else [body]
    for item in items:
        at = item.get("run_at") if isinstance(item, dict) else None
        if isinstance(at, str):
            try:
                when = datetime.fromisoformat(at.replace("Z", "+00:00"))
            except ValueError:
                continue
            if when.tzinfo is not None and when > datetime.now(UTC) + timedelta(days=365):
                return True
    return False


def _short_debounce(body: dict[str, Any]) -> bool:
    d = body.get("debounce")
    return (isinstance(d, dict) and isinstance(d.get("window_s"), int | float)
            and isinstance(d.get("max_delay_s"), int | float)
            and d["max_delay_s"] < d["window_s"])


def _bad_cron(body: dict[str, Any]) -> bool:
    cron, zone = body.get("cron"), body.get("timezone", "UTC")
    if not isinstance(cron, str) or not isinstance(zone, str):
        return False
    try:
        Cron.checked(cron, zone)
    except ValidationError:
        return True
    return False


def _bad_span(query: dict[str, Any]) -> bool:
    def day(key: str) -> date | None:
        value = query.get(key)
        try:
            return date.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            return None

    if "from" not in query and "to" not in query:
        return False
    end = day("to") or datetime.now(UTC).date()
    start = day("from") or end
    return end < start or (end - start).days >= 366


@schemathesis.hook
def filter_query(ctx: Any, query: Any) -> bool:
    return not (isinstance(query, dict) and _bad_span(query))


def _batch_to_unknown_pool(body: dict[str, Any]) -> bool:
    # A pool is data, not schema: a batch naming one that does not exist is
    # refused whole, 422 naming each such item (a single submit: 404).
    items = body.get("runs")
    return isinstance(items, list) and any(
        isinstance(item, dict) and item.get("pool") not in (None, "default")
        for item in items)


@schemathesis.hook
def filter_body(ctx: Any, body: Any) -> bool:
    if not isinstance(body, dict):
        return True
    return not (_has_nul(body) or _inverted_band(body) or _batch_to_unknown_pool(body)
                or _bad_cron(body) or _far_run_at(body) or _short_debounce(body))
