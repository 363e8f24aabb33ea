"""The store: one typed method per transition, each one named statement.

`RunStore` is the one object the processes hold; it gathers the stores of
each concern, each beside its statements in `sql/`:

    executor.py   named statements, connections, fencing, error translation
    runs.py       enqueue, read, cancel, redrive, reap, retention  (runs.sql)
    enqueue_batch.py  a bulk submit, answered as JSON text       (run_batch.sql)
    bulk.py       bulk cancel and redrive, re-prioritise           (run_bulk.sql)
    schedules.py  cron schedules and their due ticks               (schedules.sql)
    run_search.py runs by filter (RunFilter), composed per filter
    leases.py     a worker's claim, heartbeat, ack, nack, fail...  (runs.sql)
    events.py     events and durable steps      (run_events.sql, run_steps.sql)
    pools.py      pools and per-tenant settings (pools.sql)
    leaders.py    leader election               (leaders.sql)
    stats.py      queue statistics              (stats.sql)
    console.py    the web console's reads       (console.sql)
    workers.py    the workers registry          (workers.sql)
    usage.py      usage per run and per day     (usage.sql)
    rates.py      tenants' submit rates         (rates.sql)
    children.py   child runs, waiting for them  (children.sql)
    humans.py     waiting for input, the inbox  (humans.sql)
    reruns.py     a run again from a step       (reruns.sql)
    threads.py    threads: one active run each  (threads.sql)
    keys.py       concurrency keys and limits   (keys.sql)
    singletons.py singletons and debounce       (singletons.sql)
    keyed.py      a submit with any of the four, on every path (one lock order)
    webhooks.py   completion webhooks           (webhooks.sql)
    checkpoints.py LangGraph checkpoints, fenced (checkpoints.sql)

Every method validates its input first (nothing is written on bad input),
runs one statement from `sql/`, and translates psycopg errors into runlease's
own at this boundary. Worker writes take a `Lease` and raise `LeaseLost` when
the fence matches zero rows.
"""

from __future__ import annotations

from runlease.db.bulk import BulkStore
from runlease.db.checkpoints import CheckpointStore
from runlease.db.children import ChildStore
from runlease.db.console import ConsoleStore
from runlease.db.enqueue_batch import BatchEnqueued, BatchStore
from runlease.db.events import EventStore
from runlease.db.executor import Conn, stale_writes
from runlease.db.leaders import LeaderStore
from runlease.db.leases import MAX_CLAIM_BATCH, LeaseStore, Rendered
from runlease.db.pools import PoolStore
from runlease.db.rates import RateStore
from runlease.db.reruns import RerunStore
from runlease.db.run_search import RunFilter, SearchStore
from runlease.db.runs import MAX_BATCH, MAX_LIST_LIMIT, NewRun, QueueStore
from runlease.db.schedules import ScheduleStore
from runlease.db.stats import QueueStats, StatsStore
from runlease.db.usage import UsageStore
from runlease.db.webhooks import WebhookStore
from runlease.db.workers import Registration, WorkerRow, WorkerStore

__all__ = [
    "MAX_BATCH",
    "MAX_CLAIM_BATCH",
    "MAX_LIST_LIMIT",
    "BatchEnqueued",
    "Conn",
    "NewRun",
    "QueueStats",
    "Registration",
    "Rendered",
    "RunFilter",
    "RunStore",
    "WorkerRow",
    "stale_writes",
]


class RunStore(RerunStore, BulkStore, ScheduleStore, ChildStore,
               BatchStore, QueueStore, SearchStore, LeaseStore, EventStore, PoolStore,
               LeaderStore, StatsStore, WorkerStore, UsageStore, RateStore, WebhookStore,
               ConsoleStore, CheckpointStore):
    """Every store in one: what the worker, API, operator and services hold."""
