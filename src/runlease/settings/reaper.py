"""The reaper's leader-election settings, shared by the processes that host it
(every worker, and the operator)."""

from __future__ import annotations

from dataclasses import dataclass

from runlease.errors import SettingsError
from runlease.settings.mechanism import describe, setting


@dataclass(frozen=True, kw_only=True)
class ReaperSettings:
    """Declared once; a process's settings inherit them (and list them first)."""

    reaper: bool = setting(True, "Take part in the leader election that runs the reaper "
                                 "and retention.")
    reaper_interval_s: float = setting(5.0, "Seconds between reaper passes of the leader.",
                                       minimum=0.05)
    leader_ttl_s: float = setting(
        15.0, "Leadership lapses this long after the leader's last renewal.", minimum=0.3)

    def check_leader_ttl(self) -> None:
        """A term must outlive half a pass, or leadership lapses between passes.
        (Only the worker has checked this so far; the operator does not, so
        that no configuration it accepted is refused now.)"""
        if self.reaper and self.leader_ttl_s <= self.reaper_interval_s / 2:
            raise SettingsError(f"{describe('leader_ttl_s')} must be above half of "
                                "reaper_interval_s")
