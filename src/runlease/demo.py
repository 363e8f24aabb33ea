"""`runlease demo`: the queue core at work, on the embedded default.

Three tenants enqueue runs into one pool; three workers claim them in batches
under a per-tenant limit, fail some once (retried with backoff), and ack the
rest. The output shows the fair interleaving of tenants and the summary.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable

from runlease.clock import SystemClock
from runlease.db.connect import make_pool
from runlease.db.models import Pool
from runlease.db.store import NewRun, RunStore
from runlease.errors import LeaseLost

POOL = "demo"


async def run_demo(url: str, runs: int, *, echo: Callable[[str], None] = print) -> None:
    rng = random.Random(7)
    async with make_pool(url, max_size=6, application_name="runlease-demo") as pool:
        store = RunStore(pool, clock=SystemClock())
        # Backoff is 5 s at the first retry; aging off so priorities read plainly.
        await store.upsert_pool(Pool(POOL, max_attempts=3, lease_s=30, default_max_in_flight=2,
                                     priority_aging_s=0))
        big = max(1, runs * 2 // 3)
        small = max(1, (runs - big) // 2)
        batch = [NewRun("acme", {"n": i, "fail_once": i % 7 == 3}) for i in range(big)]
        batch += [NewRun("globex", {"n": i, "fail_once": False}) for i in range(small)]
        batch += [NewRun("initech", {"n": i, "fail_once": False}, priority=1)
                  for i in range(runs - big - small)]
        await store.enqueue_many(POOL, batch)
        echo(f"enqueued {len(batch)} runs into pool {POOL!r}: acme {big}, globex {small}, "
             f"initech {runs - big - small} (priority 1); each tenant may lease 2 at once")

        order: list[str] = []
        retried = Counter[str]()
        remaining = len(batch)

        async def worker(name: str) -> None:
            nonlocal remaining
            while remaining > 0:
                leases = await store.claim(POOL, name, 2)
                if not leases:
                    await asyncio.sleep(0.2)
                    continue
                for lease in leases:
                    run = lease.run
                    order.append(run.tenant_id)
                    await asyncio.sleep(rng.uniform(0.01, 0.05))  # the "agent" at work
                    try:
                        if run.input_json["fail_once"] and run.attempts == 1:
                            retried[run.tenant_id] += 1
                            await store.nack(lease, "retryable", "flaky tool, will retry")
                            echo(f"  {name}: {run.tenant_id} run {run.input_json['n']} failed, "
                                 "retrying with backoff")
                            continue
                        await store.ack(lease, {"answer": run.input_json["n"] * 2})
                        remaining -= 1
                    except LeaseLost:
                        echo(f"  {name}: lost the lease on {run.id}")

        await asyncio.gather(*(worker(f"worker-{i}") for i in range(3)))
        echo("claim order of the first 15 runs (tenants interleave; initech first by priority):")
        echo("  " + " ".join(t[0].upper() for t in order[:15]))
        done = await store.list_runs(pool=POOL, status="done", limit=500)
        by_tenant = Counter(r.tenant_id for r in done)
        echo(f"{'tenant':<10}{'done':>6}{'retried':>9}")
        for tenant in ("acme", "globex", "initech"):
            echo(f"{tenant:<10}{by_tenant[tenant]:>6}{retried[tenant]:>9}")
