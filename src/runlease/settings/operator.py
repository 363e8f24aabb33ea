"""`runlease operator`'s settings."""

from __future__ import annotations

from dataclasses import dataclass

from runlease.errors import SettingsError
from runlease.settings.mechanism import describe, setting
from runlease.settings.reaper import ReaperSettings


@dataclass(frozen=True, kw_only=True)
class OperatorSettings(ReaperSettings):
    """`runlease operator`: AgentRunPools -> workers; hosts the reaper too."""

    database_url: str | None = setting(
        None, "PostgreSQL URL the operator's reaper serves; pools name their own database "
              "through a Secret.", env=("DATABASE_URL",))
    prepared_statements: bool = setting(
        True, "Server-side prepared statements on database_url's connections; turn off "
              "behind PgBouncer in transaction mode (a pool's own database follows its "
              "spec.database.preparedStatements).")
    namespaces: tuple[str, ...] = setting(
        (), "Namespaces to watch (comma-separated); see --all-namespaces.")
    all_namespaces: bool = setting(False, "Watch every namespace (cluster-wide).")
    standalone: bool = setting(
        False, "Run without kopf peering (a single replica, or tests). With peering, "
               "replicas elect one active operator by priority; the others stand by.")
    peering_name: str = setting("runlease", "The kopf peering object replicas share.")
    priority: int | None = setting(
        None, "This replica's peering priority; random when unset, so replicas differ.",
        minimum=0, maximum=2**31 - 1)
    interval_s: float = setting(10.0, "Seconds between a pool's status, drift and "
                                      "autoscaling passes.", minimum=0.1, maximum=3600)
    lease_window_s: float = setting(300.0, "The window of the lease-health condition: "
                                           "expiries in the last this many seconds.",
                                    minimum=1)
    metrics_port: int = setting(9465, "Port of /metrics, /healthz and /readyz; 0 turns it "
                                      "off.", minimum=0, maximum=65535)
    metrics_host: str = setting("0.0.0.0", "Address /metrics listens on.")
    log_json: bool = setting(False, "Log one JSON object per line.")
    unsandboxed_pools: tuple[str, ...] = setting(
        (), "AgentRunPools (namespace/name, comma-separated) allowed to run every "
            "tenant's tools without a sandbox (spec.toolSandbox.enabled false and no "
            "spec.toolSandbox.tenant); any other such pool is refused.")

    def check(self) -> None:
        if self.all_namespaces and self.namespaces:
            raise SettingsError(f"{describe('namespaces')} and --all-namespaces exclude "
                                "each other")
        if not self.all_namespaces and not self.namespaces:
            raise SettingsError(f"name the namespaces to watch ({describe('namespaces')}) "
                                "or pass --all-namespaces")
