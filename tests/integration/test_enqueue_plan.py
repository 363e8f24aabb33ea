"""The enqueue statement's cost does not grow with the tenant's pending line:
where a batch joins the fair order is looked up once per (pool, tenant) of
the batch, not once per run. Rows read are counted from EXPLAIN ANALYZE
(through auto_explain), never timed."""

from __future__ import annotations

from runlease.db.store import NewRun, RunStore
from tests.integration.test_flat_leases import explained, nodes, reads


async def test_a_batch_reads_its_tenants_line_once_not_once_per_run(
        live_store: RunStore) -> None:
    store = live_store
    for b in range(3):  # a pending line of 3,000 runs
        await store.enqueue_many("default", [NewRun("acme", {"b": b, "i": i})
                                             for i in range(1000)])
    batch = [NewRun("acme", {"new": i}) for i in range(500)]
    results, plans = await explained(store, lambda c: store.enqueue_many(
        "default", batch, notify=False, conn=c))
    assert len(results) == 500
    assert all(r.inserted for r in results)
    plan = next(p for p in plans if any(n.get("Node Type") == "ModifyTable"
                                        and n.get("Relation Name") == "agent_runs"
                                        for n in nodes(p)))
    # Inlined, the line's end and the order's head were read for each of
    # the 500 runs: 500 x 3,000 rows. Now a few descents of an index.
    looked_up = [n for n in nodes(plan) if n.get("Relation Name") == "agent_runs"
                 and n["Node Type"] != "ModifyTable"]
    assert looked_up
    assert all(n.get("Actual Loops", 1) <= 1 for n in looked_up), [
        (n.get("Index Name"), n.get("Actual Loops")) for n in looked_up]
    read = sum(reads(n) for n in looked_up if not n.get("Plans"))
    assert read < 50, read
