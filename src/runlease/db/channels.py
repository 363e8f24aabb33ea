"""LISTEN/NOTIFY channel names, in one place. Payloads carry ids only.

NOTIFY is not durable: every listener also polls, so a lost notification
costs latency, never a run.
"""

from __future__ import annotations

# Enqueue, release, reap and redrive notify "<prefix><pool>" with the pool name.
# Pool names are at most 48 characters, so the channel fits PostgreSQL's 63.
POOL_CHANNEL_PREFIX = "runlease_pool_"
# request_cancel notifies the run id of a leased run.
CANCEL_CHANNEL = "runlease_cancel"
# A message to a leased run notifies its run id: its worker wakes the agent
# waiting in ctx.receive() (issue 28).
INBOX_CHANNEL = "runlease_inbox"
# Every recorded event, and every transition that writes a lifecycle event or
# ends a run, notifies "<run id>:<last seq>" (the API's event fan-out).
# The SQL function runlease_notify_events (migration 0007) names it too.
EVENTS_CHANNEL = "runlease_events"


def pool_channel(pool: str) -> str:
    return POOL_CHANNEL_PREFIX + pool
