"""The reaper's leader-election settings, shared by the processes that host it
(every worker, and the operator)."""

from __future__ import annotations

from dataclasses import dataclass

from runlease.core.webhooks import WebhookLimits
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
    webhook_deadline_s: float = setting(
        15.0, "The leader's completion webhooks: one delivery's whole time (resolve, "
              "connect, send, read the answer); a slower receiver is cut off.",
        minimum=0.1, maximum=50.0)
    webhook_max_response_bytes: int = setting(
        65536, "Bytes of a webhook receiver's answer read (raw, never decompressed) and "
               "discarded; the rest is not read.", minimum=0, maximum=16 * 1024 * 1024)
    webhook_in_flight: int = setting(64, "Webhook deliveries under way at once.",
                                     minimum=1, maximum=10_000)
    webhook_per_tenant: int = setting(4, "Webhook deliveries of one tenant under way at once.",
                                      minimum=1, maximum=10_000)

    def webhook_limits(self) -> WebhookLimits:
        return WebhookLimits(deadline_s=self.webhook_deadline_s,
                             max_response_bytes=self.webhook_max_response_bytes,
                             in_flight=self.webhook_in_flight,
                             per_tenant=self.webhook_per_tenant)

    def check_leader_ttl(self) -> None:
        """A term must outlive half a pass, or leadership lapses between passes.
        (Only the worker has checked this so far; the operator does not, so
        that no configuration it accepted is refused now.)"""
        if self.reaper and self.leader_ttl_s <= self.reaper_interval_s / 2:
            raise SettingsError(f"{describe('leader_ttl_s')} must be above half of "
                                "reaper_interval_s")
