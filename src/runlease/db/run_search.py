"""Finding runs by filter: the typed filter and the one place it becomes SQL.

Listing, the console and bulk actions (cancel, redrive by filter) all take a
`RunFilter` and get their statement from `select_runs`, so a filter means the
same rows everywhere and is tenant-scoped the same way: with `tenant_id` set,
nothing of another tenant can match, whatever the other fields hold.

The statement is composed, not a fixed text: each filter has its own index
to start from (a fixed statement with `%s IS NULL OR ...` gets one plan for
all of them). Every value is a parameter; statuses are validated enum values.
Which index drives the scan, newest first (ids are UUIDv7, creation-ordered):

    idempotency_key   agent_runs_idempotency_idx (pool, tenant, key)
    parent_run_id     agent_runs_parent_idx (parent_run_id, id)
    thread_id         agent_runs_thread_idx (tenant, thread, thread_seq): a thread's runs
    label             agent_run_labels (tenant, key, value, run_id), or
                      (key, value, run_id) for an admin across tenants; with
                      several, the rarest label's range, the others probed
    status=dead       agent_runs_dead_idx (id)
    finished only     agent_runs_finished_tenant_idx (tenant, id) where finished:
                      statuses done/cancelled/dead, or a finished_* bound
    otherwise         agent_run_tenant_index (tenant, run_id), or the primary
                      key for an admin across tenants

The other filters narrow that scan; created_* and finished_before also bound
it by id (a run is created, and finishes, after its id's time). No claim or
heartbeat changes a column of these indexes; a run's finish adds its one
entry to agent_runs_finished_tenant_idx (that update is not HOT anyway).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg import sql
from psycopg.rows import tuple_row

from runlease.core import bounds, run_options
from runlease.core.states import TERMINAL, RunStatus
from runlease.db.executor import Conn, Executor
from runlease.db.models import Run
from runlease.db.run_json import RUN_JSON_COLUMNS, page_json
from runlease.errors import ValidationError

MAX_LABEL_FILTERS = run_options.LABELS_MAX
MAX_LIMIT = 500
# Ids carry the API host's clock, created_at and finished_at the database's:
# id bounds are widened by this much so a skewed clock loses no run (the
# exact comparison on the timestamp column still applies).
CLOCK_SKEW = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Which runs: every field given must match (AND); statuses and labels
    are lists (any of the statuses, all of the labels). `tenant_id` None is
    every tenant's runs: only for admins; the API sets it from the token."""

    tenant_id: str | None = None
    statuses: tuple[RunStatus, ...] = ()
    pool: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    created_after: datetime | None = None
    created_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    idempotency_key: str | None = None
    parent_run_id: UUID | None = None  # that run's children
    id_prefix: str | None = None  # ids starting with these hex digits (8 to 32)
    thread_id: str | None = None  # a thread's runs (with tenant_id)

    def validated(self) -> RunFilter:
        """This filter, or a ValidationError naming the field at fault."""
        if self.tenant_id is not None:
            bounds.check_tenant(self.tenant_id)
        if self.pool is not None:
            bounds.check_pool(self.pool)
        statuses = []
        for s in self.statuses:
            try:
                statuses.append(RunStatus(s))
            except ValueError:
                raise ValidationError(
                    "status", f"must be one of {', '.join(x.value for x in RunStatus)}"
                ) from None
        if len(self.labels) > MAX_LABEL_FILTERS:
            raise ValidationError("label", f"at most {MAX_LABEL_FILTERS} label filters")
        for key, value in self.labels:
            run_options.check_label_key("label", key)
            run_options.check_label_value("label", value)
        for name in ("created_after", "created_before", "finished_after", "finished_before"):
            stamp = getattr(self, name)
            if stamp is not None and (not isinstance(stamp, datetime) or stamp.tzinfo is None):
                raise ValidationError(name, "must be an RFC 3339 time with its offset")
        if self.id_prefix is not None:
            id_range(self.id_prefix)
        if self.idempotency_key is not None:
            bounds.check_idempotency_key(self.idempotency_key)
            if self.tenant_id is None:
                raise ValidationError("idempotency_key", "a key is a tenant's own: give "
                                                         "`tenant` with it")
        return self._thread_validated()

    def _thread_validated(self) -> RunFilter:
        if self.thread_id is not None:
            bounds.check_thread(self.thread_id)
            if self.tenant_id is None:
                raise ValidationError("thread_id", "a thread is a tenant's own: give "
                                                   "`tenant` with it")
        return self


ID_PREFIX_MIN = 8


def id_range(prefix: str) -> tuple[UUID, UUID]:
    """The first and last UUID starting with `prefix` (hex digits, dashes
    where an id has them, at least 8 digits): an id prefix is a range of the
    primary key (and of every index that ends with the run id)."""
    digits = prefix.replace("-", "").lower()
    if not (ID_PREFIX_MIN <= len(digits) <= 32) or digits.strip("0123456789abcdef") \
            or len(prefix) > 36:
        raise ValidationError("id_prefix", f"{ID_PREFIX_MIN} to 32 hex digits of a run id")
    return (UUID(digits.ljust(32, "0")), UUID(digits.ljust(32, "f")))


_MS_MAX = (1 << 48) - 1


def uuid_floor(at: datetime, shift: timedelta = timedelta(0)) -> UUID:
    """The smallest UUIDv7 of the millisecond `at + shift`, clamped to the
    UUIDv7 range: a time at either end of the calendar (0001-01-01, or
    9999-12-31 with a negative offset) is a filter, not an OverflowError."""
    try:
        ms = int(at.timestamp() * 1000) + int(shift.total_seconds() * 1000)
    except (OverflowError, ValueError):
        ms = 0 if at.year < 5000 else _MS_MAX
    return UUID(int=min(_MS_MAX, max(0, ms)) << 80)


# With its lease's expiry: the holder incarnation's (one lookup by primary
# key, only for a leased run).
ALL_COLUMNS = sql.SQL("r.*, (SELECT w.expires_at FROM agent_run_workers w"
                      " WHERE w.id = r.locked_by) AS locked_until")
# Each side-table row's run, by primary key, in the side table's order. OFFSET
# 0 keeps the planner from flattening it into a join: estimating a status
# rare, it would read all of agent_runs and hash-join; this way a page costs
# its runs' lookups, newest first, until the page is full.
BY_ID = sql.SQL(" CROSS JOIN LATERAL (SELECT * FROM agent_runs x WHERE x.id = d.run_id "
                "OFFSET 0) r")


def select_runs(f: RunFilter, *, limit: int | None = None, before: UUID | None = None,
                columns: sql.Composable = ALL_COLUMNS) -> tuple[sql.Composed, dict[str, Any]]:
    """The statement for the runs `f` matches, newest first, with `before`
    (a run id, the last of the previous page) as the keyset cursor, and its
    parameters. `columns` is over `r` (agent_runs), e.g. sql.SQL("r.id")."""
    p: dict[str, Any] = {}
    where: list[sql.Composable] = []
    if f.tenant_id is not None:
        p["tenant"] = f.tenant_id
        where.append(sql.SQL("r.tenant_id = %(tenant)s"))
    source, key = _source(f, p, where)
    _narrow(f, key, p, where)
    if before is not None:
        p["before"] = before
        where.append(sql.SQL("{} < %(before)s").format(key))
    query = sql.SQL("SELECT {columns} FROM {source}{where} ORDER BY {key} DESC").format(
        columns=columns, source=source, key=key,
        where=sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""))
    if limit is not None:
        p["limit"] = limit
        query += sql.SQL(" LIMIT %(limit)s")
    return query, p


def _source(f: RunFilter, p: dict[str, Any],
            where: list[sql.Composable]) -> tuple[sql.Composable, sql.Composable]:
    """Where the scan starts (see the module's docstring), and its id column."""
    if f.idempotency_key is not None:
        # The key's index leads with the pool: every pool, one descent each.
        p["key"] = f.idempotency_key
        where.append(sql.SQL("r.idempotency_key = %(key)s AND r.pool = ANY ("
                             + ("ARRAY[%(pool)s::text]" if f.pool is not None
                                else "ARRAY(SELECT name FROM agent_run_pools)") + ")"))
        return sql.SQL("agent_runs r"), sql.SQL("r.id")
    if f.thread_id is not None and f.tenant_id is not None:
        # A thread's runs, through agent_runs_thread_idx (bounded by the
        # thread); the thread's own condition is in _narrow.
        if f.labels:
            p["labels"] = json.dumps(dict(f.labels))
            where.append(sql.SQL("r.labels @> %(labels)s::jsonb"))
        return sql.SQL("agent_runs r"), sql.SQL("r.id")
    if f.parent_run_id is not None:
        # A run's children through agent_runs_parent_idx (parent_run_id, id);
        # the parent's own condition is in _narrow, so it holds on every source.
        if f.labels:
            p["labels"] = json.dumps(dict(f.labels))
            where.append(sql.SQL("r.labels @> %(labels)s::jsonb"))
        return sql.SQL("agent_runs r"), sql.SQL("r.id")
    if f.labels:
        return _by_labels(f, p, where), sql.SQL("d.run_id")
    if f.tenant_id is not None and tuple(f.statuses) != (RunStatus.DEAD,):
        if _finished_only(f):
            # Implied by the statuses (a CHECK ties them), said for the planner.
            where.append(sql.SQL("r.finished_at IS NOT NULL"))
            return sql.SQL("agent_runs r"), sql.SQL("r.id")
        where.append(sql.SQL("d.tenant_id = %(tenant)s"))
        return sql.SQL("agent_run_tenant_index d") + BY_ID, sql.SQL("d.run_id")
    # Every tenant's runs by primary key; or a tenant's dead ones through
    # agent_runs_dead_idx (dead runs are few, and may be far back in a
    # tenant's line).
    return sql.SQL("agent_runs r"), sql.SQL("r.id")


def _finished_only(f: RunFilter) -> bool:
    """Whether only finished runs can match: agent_runs_finished_tenant_idx has them all."""
    if f.statuses:
        return TERMINAL.issuperset(f.statuses)
    return f.finished_after is not None or f.finished_before is not None


def _by_labels(f: RunFilter, p: dict[str, Any], where: list[sql.Composable]) -> sql.Composable:
    """The side table's rows of the first label, newest first, and for each
    of them every further label looked up by its key (tenant, key, value,
    run_id): one probe each, in subqueries the planner cannot flatten. As a
    join, the plan was the planner's: under the API's generic plans it
    rescanned the second label's whole range for each row of the first
    (team:x&case:y, which never meet: 166 ms over 250,000 runs). Reading the
    first label's runs and checking the labels column instead reads every run
    of the first label when the others are rare. SearchStore puts the rarest
    label first (label_counts), so the scan is the shortest range."""
    wanted = dict(f.labels)
    if len(wanted) < len(set(f.labels)):  # two values for one key: nothing matches
        where.append(sql.SQL("false"))
    source: sql.Composable = sql.SQL("agent_run_labels d")
    for i, (key, value) in enumerate(wanted.items()):
        p[f"label_key_{i}"], p[f"label_value_{i}"] = key, value
        t = sql.Identifier(f"d{i}" if i else "d")
        match = sql.SQL("{t}.key = {k} AND {t}.value = {v}").format(
            t=t, k=sql.Placeholder(f"label_key_{i}"), v=sql.Placeholder(f"label_value_{i}"))
        if f.tenant_id is not None:
            match += sql.SQL(" AND {}.tenant_id = %(tenant)s").format(t)
        if i == 0:
            where.append(match)
        else:
            source += sql.SQL(" CROSS JOIN LATERAL (SELECT 1 FROM agent_run_labels {t} WHERE "
                              "{t}.run_id = d.run_id AND {match} OFFSET 0) {t}").format(
                t=t, match=match)
    return source + BY_ID


# Each label's runs are counted up to this many to start from the rarest.
LABEL_COUNT_CAP = 2000


def label_counts(f: RunFilter) -> tuple[sql.Composed, dict[str, Any]]:
    """One row: how many runs each of f's labels has, up to LABEL_COUNT_CAP
    (an index-only range each, at most that long)."""
    p: dict[str, Any] = {"cap": LABEL_COUNT_CAP}
    if f.tenant_id is not None:
        p["tenant"] = f.tenant_id
    counts = []
    for i, (key, value) in enumerate(f.labels):
        p[f"label_key_{i}"], p[f"label_value_{i}"] = key, value
        counts.append(sql.SQL(
            "(SELECT count(*) FROM (SELECT 1 FROM agent_run_labels WHERE key = {k} AND "
            "value = {v}{tenant} LIMIT %(cap)s) c)").format(
            k=sql.Placeholder(f"label_key_{i}"), v=sql.Placeholder(f"label_value_{i}"),
            tenant=sql.SQL("" if f.tenant_id is None else " AND tenant_id = %(tenant)s")))
    return sql.SQL("SELECT ") + sql.SQL(", ").join(counts), p


def _narrow(f: RunFilter, key: sql.Composable, p: dict[str, Any],
            where: list[sql.Composable]) -> None:
    """The other filters, on the run's own columns (and bounds on the id)."""
    if f.parent_run_id is not None:
        p["parent"] = f.parent_run_id
        where.append(sql.SQL("r.parent_run_id = %(parent)s"))
    if f.thread_id is not None:
        p["thread"] = f.thread_id
        where.append(sql.SQL("r.thread_id = %(thread)s AND r.thread_id IS NOT NULL"))
    if f.statuses:
        where.append(sql.SQL("r.status IN ({})").format(
            sql.SQL(", ").join(sql.Literal(RunStatus(s).value) for s in f.statuses)))
    if f.pool is not None:
        p["pool"] = f.pool
        where.append(sql.SQL("r.pool = %(pool)s"))
    if f.id_prefix is not None:
        p["id_lo"], p["id_hi"] = id_range(f.id_prefix)
        where.append(sql.SQL("{key} >= %(id_lo)s AND {key} <= %(id_hi)s").format(key=key))
    for name, op, column, bound in (
            ("created_after", ">=", "created_at", -CLOCK_SKEW),
            ("created_before", "<", "created_at", CLOCK_SKEW),
            ("finished_after", ">=", "finished_at", None),
            ("finished_before", "<", "finished_at", CLOCK_SKEW)):
        at: datetime | None = getattr(f, name)
        if at is None:
            continue
        p[name] = at
        where.append(sql.SQL("r.{} {} {}").format(sql.Identifier(column), sql.SQL(op),
                                                   sql.Placeholder(name)))
        if bound is not None:
            p[name + "_id"] = uuid_floor(at, bound)
            where.append(sql.SQL("{} {} {}").format(key, sql.SQL(op),
                                                    sql.Placeholder(name + "_id")))


class SearchStore(Executor):
    """Runs by filter, a page at a time (the API's GET /v1/runs)."""

    async def search(self, f: RunFilter, *, limit: int = 50, before: UUID | None = None,
                     conn: Conn | None = None) -> list[Run]:
        """Newest first; pass the last id of a page as `before` for the next."""
        _check_limit(limit)
        async with self.connection(conn) as c:
            ordered = await self._rarest_label_first(f.validated(), c)
            if ordered is None:
                return []
            query, params = select_runs(ordered, limit=limit, before=before)
            async with c.cursor() as cur:
                await cur.execute(query, params)
                return [Run.from_row(r) for r in await cur.fetchall()]

    async def search_page(self, f: RunFilter, *, admin: bool, limit: int = 50,
                          before: UUID | None = None, conn: Conn | None = None) -> bytes:
        """The runs `search` finds as the API's page (RunPage) JSON text,
        rendered by the statement (db/run_json.py); `admin` shows leases."""
        _check_limit(limit)
        async with self.connection(conn) as c:
            ordered = await self._rarest_label_first(f.validated(), c)
            if ordered is None:
                return page_json([], limit)
            query, params = select_runs(ordered, limit=limit, before=before,
                                        columns=RUN_JSON_COLUMNS[admin])
            async with c.cursor(row_factory=tuple_row) as cur:
                await cur.execute(query, params)
                return page_json(await cur.fetchall(), limit)

    async def _rarest_label_first(self, f: RunFilter, c: Conn) -> RunFilter | None:
        """f with its labels from the one with the fewest runs (the scan
        starts from the first); None when a label has no run at all."""
        if len(f.labels) < 2:
            return f
        query, params = label_counts(f)
        async with c.cursor(row_factory=tuple_row) as cur:
            await cur.execute(query, params)
            counts = await cur.fetchone()
        assert counts is not None
        if 0 in counts:
            return None
        order = sorted(range(len(f.labels)), key=lambda i: int(counts[i]))
        return replace(f, labels=tuple(f.labels[i] for i in order))


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValidationError("limit", f"must be between 1 and {MAX_LIMIT}")
