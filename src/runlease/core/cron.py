"""Cron expressions in a time zone: checking them, and the ticks around a
moment. Five fields (minute hour day-of-month month day-of-week, as cron
and cronsim read them); the time zone is an IANA name (zoneinfo). A tick at
a wall-clock time that a DST change skips or repeats happens once, as
cronsim decides (the skipped hour's ticks at the first valid moment after)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from runlease.errors import ValidationError

CRON_MAX_CHARS = 255
TIMEZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+){0,2}$"
_TZ_RE = re.compile(TIMEZONE_PATTERN)
_ONE_SECOND = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class Cron:
    expr: str
    timezone: str

    @classmethod
    def checked(cls, expr: object, timezone: object = "UTC") -> Cron:
        """The expression and zone, validated (ValidationError names the field)."""
        if not isinstance(expr, str) or not 9 <= len(expr) <= CRON_MAX_CHARS:
            raise ValidationError("cron", "must be a cron expression of 5 fields")
        if any(c.isspace() and c not in " \t" for c in expr):
            raise ValidationError("cron", "fields are separated by spaces or tabs only")
        fields = expr.split()
        if len(fields) != 5:
            raise ValidationError("cron", "must have 5 fields (minute hour day-of-month month "
                                          f"day-of-week), got {len(fields)}")
        if not isinstance(timezone, str) or len(timezone) > 64 or not _TZ_RE.match(timezone):
            raise ValidationError("timezone", "must be an IANA time zone name such as UTC or "
                                              "Europe/Berlin")
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise ValidationError("timezone", f"unknown time zone {timezone!r}") from None
        cron = cls(" ".join(fields), timezone)
        try:
            next(CronSim(cron.expr, datetime.now(zone)))
        except (CronSimError, StopIteration) as exc:
            raise ValidationError("cron", f"not a valid cron expression: {exc}") from None
        return cron

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after `moment`, in UTC."""
        return next(CronSim(self.expr, moment.astimezone(self.zone))).astimezone(UTC)

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last tick at or before `moment`, in UTC."""
        local = moment.astimezone(self.zone).replace(microsecond=0) + _ONE_SECOND
        return next(CronSim(self.expr, local, reverse=True)).astimezone(UTC)
