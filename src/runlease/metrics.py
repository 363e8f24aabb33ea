"""Every Prometheus metric runlease exports, defined in one place.

Dashboards and alerts (charts/) may only name metrics defined here; a test
checks it. Label values are bounded: pools, tenants, outcomes, error codes.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from runlease.core.states import Outcome


@lru_cache(maxsize=8192)
def child(metric: Any, *labels: str) -> Any:
    """metric.labels(*labels), remembered: the worker's per-run hot path calls
    this several times a run, and prometheus_client's own lookup is slow."""
    return metric.labels(*labels)


_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)

# -- worker ------------------------------------------------------------------
RUNS_CLAIMED = Counter("runlease_runs_claimed_total", "Runs claimed by this worker.", ["pool"])
RUNS_FINISHED = Counter(
    "runlease_runs_finished_total",
    f"Runs this worker finished, by outcome: {', '.join(Outcome)}.",
    ["pool", "outcome"],
)
# By pool only: a worker's /metrics is reachable by its tools (they share its
# network), so it names no tenant (issue 32); runs per tenant are the
# operator's runlease_queue_runs{status="leased"}.
RUNS_IN_FLIGHT = Gauge("runlease_runs_in_flight", "Runs this worker holds now.", ["pool"])
HEARTBEATS = Counter("runlease_heartbeats_total", "Lease renewal statements, by result.",
                     ["pool", "result"])
LEASES_LOST = Counter("runlease_leases_lost_total",
                      "Runs whose renewal or fenced write found the lease gone.", ["pool"])
SELF_FENCED = Counter(
    "runlease_self_fenced_total",
    "Runs stopped by the worker's own clock because it could not renew in time.", ["pool"])
STALE_WRITES = Counter(
    "runlease_stale_writes_rejected_total",
    "Fenced writes refused because the lease was gone: heartbeats, events, steps, acks, "
    "nacks, fails, cancels and releases that matched no row.",
    ["pool"])
HEARTBEAT_DELAY = Histogram(
    "runlease_heartbeat_delay_seconds",
    "How late the lease keeper woke for a renewal or a fence check: time the event loop "
    "was blocked (by agent code that does not await, say). Runs are fenced by the clock, "
    "so a long stall self-fences them.",
    ["pool"], buckets=(*_LATENCY_BUCKETS, 10.0, 30.0, 60.0))
CANCELS = Counter("runlease_cancels_total", "Cancel requests this worker acted on.", ["pool"])
CANCEL_LATENCY = Histogram(
    "runlease_cancel_latency_seconds",
    "From the cancel request to the run finalized cancelled, by the database clock.",
    ["pool"], buckets=_LATENCY_BUCKETS)
CLAIM_LATENCY = Histogram("runlease_claim_latency_seconds", "Duration of one claim statement.",
                          ["pool"], buckets=_LATENCY_BUCKETS)
RUN_DURATION = Histogram("runlease_run_duration_seconds",
                         "Time from claim to outcome of one attempt.", ["pool", "outcome"],
                         buckets=_DURATION_BUCKETS)
WORKER_DRAINING = Gauge("runlease_worker_draining", "1 while this worker drains.", ["pool"])
WORKER_SLOTS = Gauge("runlease_worker_slots", "Run slots of this worker (its concurrency).",
                     ["pool"])

# -- services (reaper and leader election), in workers, the operator, dev --------
REAPED = Counter("runlease_reaped_total",
                 "Expired leases the reaper handled, by where the run went: pending, dead, "
                 "cancelled.", ["pool", "to"])
SCHEDULE_TICKS = Counter("runlease_schedule_ticks_total",
                         "Due schedule ticks the leader handled, by outcome "
                         "(enqueued, skipped: overlap or refused, missed: caught up).",
                         ["outcome"])
RETENTION_DELETED = Counter("runlease_retention_deleted_total",
                            "Finished runs deleted by retention.")
LEADER = Gauge("runlease_leader", "1 while this process is the elected leader.", ["name"])
LEADER_CHANGES = Counter("runlease_leader_changes_total",
                         "Times this process gained or lost leadership.", ["name", "change"])

# -- API ---------------------------------------------------------------------------
API_REQUESTS = Counter("runlease_api_requests_total", "HTTP requests, by route and status.",
                       ["method", "route", "status"])
API_LATENCY = Histogram("runlease_api_request_duration_seconds",
                        "HTTP request duration (for event streams: until the response starts).",
                        ["method", "route"], buckets=_LATENCY_BUCKETS)
RUNS_SUBMITTED = Counter("runlease_runs_submitted_total", "Runs enqueued through the API.",
                         ["pool"])
SSE_STREAMS = Gauge("runlease_sse_streams", "Event streams open now.")
SSE_FEED_READS = Counter("runlease_sse_feed_reads_total",
                          "Statements the event fan-out ran (each reads every woken run).")

# -- operator ------------------------------------------------------------------------
QUEUE_RUNS = Gauge("runlease_queue_runs",
                   "Runs in the queue by pool, tenant and status (pending, ready, leased, "
                   "waiting: for a person's input).",
                   ["pool", "tenant", "status"])
KEY_WAITING = Gauge("runlease_key_waiting_runs",
                    "Runs parked for a slot of their concurrency key: the pool's 10 keys "
                    "with the most (other keys are not shown: bounded labels).",
                    ["pool", "tenant", "key"])
DEAD_RUNS = Gauge("runlease_dead_runs", "Dead runs (dead letters) by pool and error code.",
                  ["pool", "error_code"])
OLDEST_PENDING = Gauge("runlease_oldest_pending_seconds",
                       "How long the oldest run ready to claim has waited.", ["pool"])
LEASE_EXPIRIES = Gauge("runlease_lease_expiries_recent",
                       "Leases that expired in the operator's lease-health window.", ["pool"])
DESIRED_REPLICAS = Gauge("runlease_pool_desired_replicas",
                         "Worker replicas the autoscaler wants.", ["namespace", "pool"])
POOL_REPLICAS = Gauge("runlease_pool_replicas", "Worker replicas, and ready ones.",
                      ["namespace", "pool", "state"])
RECONCILE_ERRORS = Counter("runlease_operator_reconcile_errors_total",
                           "Failed reconciles of an AgentRunPool, by reason.", ["reason"])
SCALE_CHANGES = Counter("runlease_operator_scale_changes_total",
                        "Replica changes made by the autoscaler.", ["direction"])
