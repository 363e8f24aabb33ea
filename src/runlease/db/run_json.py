"""A run as the API shows it (RunOut in api/schemas.py), rendered by PostgreSQL.

A list page's runs are written as JSON text by the statement that finds them:
no row becomes a dict and a `Run`, no jsonb column is parsed into Python
objects to be dumped again. In the API process that was most of a page's
CPU (fetching 50 rows as dicts, parsing their JSON columns, building the
runs and rendering them: about half of a page's 4.5 ms under load), for
0.4 ms more of the database's (50 runs). The text is the same
JSON as `run_out_fields` renders (the same members in the same order, equal
values; a jsonb column keeps its own spacing): tests/integration/test_run_json_sql.py
compares the two for runs in every state, for tenants and admins.
"""

from __future__ import annotations

from psycopg import sql

from runlease.core.backoff import BACKOFF_BASE_S, BACKOFF_CAP_S


def _time(column: str) -> sql.Composable:
    # pydantic's text for a time in UTC: microseconds only when there are
    # some, then Z (the API's connections run in UTC; another zone would
    # only change the offset a Python rendering shows, not the instant).
    c = sql.SQL(column)
    return sql.SQL(
        "to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS')"
        " || CASE WHEN date_trunc('second', {c}) = {c} THEN ''"
        " ELSE to_char({c} AT TIME ZONE 'UTC', '.US') END || 'Z'").format(c=c)


# float(cost) as pydantic writes it: a whole number keeps its ".0" (PostgreSQL
# would write 2, which a typed client reads as an integer).
_COST = sql.SQL(
    "CASE WHEN r.cost = trunc(r.cost) AND r.cost < 1e15"
    " THEN (trunc(r.cost)::bigint::text || '.0')::json ELSE to_json(r.cost::float8) END")


def _lease(admin: bool) -> sql.Composable:
    if not admin:  # who holds a run is shown to admins only
        return sql.SQL("NULL::json")
    # The lease's expiry is its holder incarnation's (agent_run_workers).
    return sql.SQL(
        "CASE WHEN r.locked_by IS NOT NULL THEN (SELECT"
        " json_build_object('locked_by', r.locked_by, 'locked_until', {until},"
        " 'lease_epoch', r.lease_epoch) FROM agent_run_workers w WHERE w.id = r.locked_by)"
        " END").format(until=_time("w.expires_at"))


def _columns(admin: bool) -> sql.Composable:
    # row_to_json of a row of named columns, not json_build_object: half the
    # cost here (0.6 against 1.2 ms for 50 runs), and compact text. A column
    # typed json goes in as it is; text is quoted.
    fields: list[tuple[str, sql.Composable]] = [
        ("id", sql.SQL("r.id")), ("pool", sql.SQL("r.pool")),
        ("tenant_id", sql.SQL("r.tenant_id")), ("status", sql.SQL("r.status")),
        ("priority", sql.SQL("r.priority")), ("attempts", sql.SQL("r.attempts")),
        ("max_attempts", sql.SQL("r.max_attempts")), ("input", sql.SQL("r.input_json")),
        ("budget", sql.SQL("r.budget_json")), ("result", sql.SQL("r.result_json")),
        ("error_code", sql.SQL("r.error_code")), ("error_message", sql.SQL("r.error_message")),
        ("idempotency_key", sql.SQL("r.idempotency_key")),
        ("cancel_requested_at", _time("r.cancel_requested_at")),
        ("available_at", _time("r.available_at")), ("created_at", _time("r.created_at")),
        ("updated_at", _time("r.updated_at")), ("finished_at", _time("r.finished_at")),
        ("last_event_seq", sql.SQL("r.event_seq")), ("lease", _lease(admin)),
        ("labels", sql.SQL("r.labels")),
        ("backoff_base_s", sql.SQL("coalesce(r.backoff_base_s, {})").format(
            sql.Literal(BACKOFF_BASE_S))),
        ("backoff_cap_s", sql.SQL("coalesce(r.backoff_cap_s, {})").format(
            sql.Literal(BACKOFF_CAP_S))),
        ("non_retryable_codes", sql.SQL("coalesce(r.non_retryable_codes, '{}')")),
        ("usage", sql.SQL(
            "(SELECT row_to_json(u) FROM (SELECT r.input_tokens, r.output_tokens,"
            " {cost} AS cost, r.turns_used AS turns, r.tool_calls_used AS tool_calls) u)"
        ).format(cost=_COST)),
        ("parent_run_id", sql.SQL("r.parent_run_id")),
        ("awaiting_children", sql.SQL("r.awaiting_children")),
        ("thread_id", sql.SQL("r.thread_id")), ("rolled_back", sql.SQL("r.rolled_back")),
        ("concurrency_key", sql.SQL("r.concurrency_key")),
        ("messages", sql.SQL("json_build_object('sent', r.inbox_seq, 'taken', r.inbox_read)")),
        ("rerun_of", sql.SQL("r.rerun_of")), ("title", sql.SQL("r.title")),
    ]
    members = sql.SQL(", ").join(sql.SQL("{} AS {}").format(value, sql.Identifier(name))
                                 for name, value in fields)
    return sql.SQL("r.id::text, (SELECT row_to_json(x)::text FROM (SELECT {}) x)").format(
        members)


# `r.id` as text and the run's JSON text, over `r` (agent_runs): the
# `columns` of db/run_search.select_runs, for a tenant and for an admin. One
# piece of text each: composed, it would be joined again at every request.
RUN_JSON_COLUMNS = {admin: sql.SQL(_columns(admin).as_string(None)) for admin in (False, True)}


def page_json(rows: list[tuple[str, str]], limit: int) -> bytes:
    """A RunPage's JSON text from (id, run JSON) rows: a next cursor when the
    page is full, as api/schemas.run_page_json."""
    cursor = f'"{rows[-1][0]}"' if rows and len(rows) == limit else "null"
    return f'{{"items":[{",".join(text for _, text in rows)}],"next_cursor":{cursor}}}'.encode()
