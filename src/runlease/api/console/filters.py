"""The runs page's filters: query parameters into a RunFilter (db/run_search.py),
scoped to the viewer, and back into links.

Times come from the browser's datetime-local fields, in the viewer's zone:
console.js fills `tz` with the browser's offset from UTC (minutes, as
Date.getTimezoneOffset gives it); without it they are read as UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode
from uuid import UUID

from starlette.requests import Request

from runlease.api.console.deps import BadRequest
from runlease.api.search import split_label
from runlease.core import bounds, run_options
from runlease.core.states import RunStatus
from runlease.db.run_search import RunFilter
from runlease.errors import ValidationError

MAX_TZ_MINUTES = 14 * 60


def statuses() -> tuple[str, ...]:
    """Every status a run can have, as this runlease knows them (a status
    added later, as `waiting`, is offered and filtered by with no change here)."""
    return tuple(s.value for s in RunStatus)


STATUSES = statuses()


def _checked_statuses(wanted: tuple[str, ...]) -> tuple[RunStatus, ...]:
    known = statuses()
    for status in wanted:
        if status not in known:
            raise ValidationError("status", f"{status[:40]!r}: each must be one of "
                                            f"{', '.join(known)}")
    return tuple(RunStatus(s) for s in wanted)


def _when(text: str, tz_minutes: int, name: str) -> datetime | None:
    if not text:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(f"{name}: not a date and time") from None
    if at.tzinfo is None:
        try:
            at = (at + timedelta(minutes=tz_minutes)).replace(tzinfo=UTC)
        except OverflowError:  # at an end of the calendar: that end (issue 32: a 500)
            at = (datetime.min if at.year < 5000 else datetime.max).replace(tzinfo=UTC)
    return at


@dataclass(frozen=True)
class Filters:
    statuses: tuple[str, ...] = ()  # any of these (none: every status)
    pool: str = ""
    tenant: str = ""
    q: str = ""
    cursor: str = ""
    labels: tuple[str, ...] = ()
    created_after: str = ""
    created_before: str = ""
    tz: str = ""
    run_filter: RunFilter = field(default_factory=RunFilter, compare=False)

    @classmethod
    def parse(cls, request: Request, admin: bool, scope: str | None) -> Filters:
        args = request.query_params
        get = {k: args.get(k, "").strip() for k in (
            "pool", "tenant", "q", "cursor", "created_after", "created_before", "tz")}
        wanted = tuple(dict.fromkeys(v.strip() for v in args.getlist("status") if v.strip()))
        if not admin:
            get["tenant"] = ""  # a tenant sees its own runs, whatever the link says
        labels = tuple(dict.fromkeys(v.strip() for v in args.getlist("label") if v.strip()))
        try:
            tz = int(get["tz"] or 0)
        except ValueError:
            raise BadRequest("tz: minutes from UTC") from None
        if abs(tz) > MAX_TZ_MINUTES:
            raise BadRequest("tz: minutes from UTC")
        try:
            if get["q"] and len(get["q"]) > bounds.KEY_MAX_CHARS:
                raise ValidationError("search", "too long for an id or idempotency key")
            if get["cursor"]:
                UUID(get["cursor"])
            if len(labels) > run_options.LABELS_MAX:
                raise ValidationError("label", f"at most {run_options.LABELS_MAX}")
            pairs = []
            for item in labels:
                if "=" not in item and ":" not in item:
                    raise ValidationError("label", f"{item[:70]!r}: write key=value")
                key, value = split_label(item)
                pairs.append((key.strip(), value.strip()))
            rf = RunFilter(
                tenant_id=get["tenant"] or scope,
                statuses=_checked_statuses(wanted),
                pool=get["pool"] or None, labels=tuple(pairs),
                created_after=_when(get["created_after"], tz, "created from"),
                created_before=_when(get["created_before"], tz, "created before"),
            ).validated()
        except ValidationError as exc:
            raise BadRequest(f"{exc.field}: {exc.message}") from None
        except ValueError:
            raise BadRequest("cursor: not a run id") from None
        return cls(wanted, get["pool"], get["tenant"], get["q"], get["cursor"], labels,
                   get["created_after"], get["created_before"], get["tz"], rf)

    @property
    def any(self) -> bool:
        return bool(self.statuses or self.pool or self.tenant or self.q or self.cursor
                    or self.labels or self.created_after or self.created_before)

    @property
    def status(self) -> str:
        """The one status filtered on, if one (links that set one status)."""
        return self.statuses[0] if len(self.statuses) == 1 else ""

    def query(self, statuses: tuple[str, ...] | None = None, **override: str) -> str:
        """The filters as a query string; `statuses` replaces the statuses."""
        values = {"pool": self.pool, "tenant": self.tenant,
                  "q": self.q, "cursor": self.cursor, "created_after": self.created_after,
                  "created_before": self.created_before,
                  "tz": self.tz if (self.created_after or self.created_before) else ""
                  } | override
        pairs = ([("status", v) for v in (self.statuses if statuses is None else statuses)]
                 + [(k, v) for k, v in values.items() if v]
                 + [("label", v) for v in self.labels])
        return urlencode(pairs)
