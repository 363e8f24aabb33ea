"""Replicas from demand: up at once, down only after a delay. Pure.

Demand (`depth` here) is the runs a claim could start now plus the runs
leased (handlers.demand, store.startable_runs): a backlog that tenant caps,
backoff or a pause keep from starting asks for no worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from runlease.operator.spec import PoolSpec


def wanted(spec: PoolSpec, depth: int) -> int:
    """clamp(ceil(depth / (concurrencyPerWorker x targetRunsPerWorker)), min, max)."""
    if not spec.autoscaling:
        return spec.replicas_min
    per_worker = spec.concurrency_per_worker * spec.target_runs_per_worker
    return max(spec.replicas_min, min(spec.replicas_max, math.ceil(depth / per_worker)))


@dataclass(frozen=True)
class Decision:
    replicas: int
    low_since: datetime | None  # since when demand has been below `replicas`
    changed: bool


def decide(spec: PoolSpec, current: int, depth: int, low_since: datetime | None,
           now: datetime) -> Decision:
    target = wanted(spec, depth)
    if not spec.autoscaling or target >= current:
        return Decision(target, None, target != current)
    since = low_since or now
    if now - since >= timedelta(seconds=spec.scale_down_delay_s):
        return Decision(target, None, True)
    return Decision(current, since, False)
