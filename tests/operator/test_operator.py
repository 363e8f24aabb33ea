"""The running operator (kopf in-process) against KMock, with a real PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import psycopg

from runlease.db.connect import make_conn_pool
from runlease.db.store import NewRun, RunStore
from tests.operator.conftest import (
    DEPLOYMENTS,
    MERGE,
    NS,
    PDBS,
    PODS,
    POOLS,
    POOLS_URL,
    SERVICES,
    create_pool,
    database_secret,
    requests_of,
    running_operator,
    stored,
)
from tests.operator.hostile import HOSTILE_NAMES
from tests.support.databases import RegisteringStore
from tests.support.waiting import eventually

OWNER = {"apiVersion": "runlease.dev/v1alpha1", "kind": "AgentRunPool", "name": "batch",
         "uid": "uid-batch", "controller": True, "blockOwnerDeletion": True}


def pool_status(k: Any, name: str = "batch", ns: str = NS) -> dict[str, Any]:
    return dict(stored(k, POOLS, name, ns).get("status") or {})


def condition(k: Any, kind: str, name: str = "batch", ns: str = NS) -> dict[str, Any]:
    return next(c for c in pool_status(k, name, ns).get("conditions", [])
                if c["type"] == kind)


async def enqueue(db_url: str, pool: str, n: int, tenant: str = "acme") -> None:
    async with make_conn_pool(db_url, max_size=1) as conn_pool:
        await RunStore(conn_pool).enqueue_many(pool, [NewRun(tenant, {"i": i}) for i in range(n)])


async def test_a_pool_becomes_workers_with_status(kmock: Any, kubeconfig: str,
                                                  db_url: str) -> None:
    database_secret(kmock, db_url)
    async with running_operator(kmock):
        await create_pool(kmock, "batch", concurrencyPerWorker=5,
                          replicas={"min": 1, "max": 4}, retentionSeconds=3600, paused=True,
                          toolEnv=["GITHUB_TOKEN", "HTTPS_PROXY"],
                          tenants={"defaultMaxInFlight": 3,
                                   "overrides": [{"tenant": "vip", "maxInFlight": 10},
                                                 {"tenant": "low", "priorityMin": -10,
                                                  "priorityMax": 0, "submitsPerMinute": 60,
                                                  "tokensPerMinute": 50_000}]})
        await eventually(lambda: stored(kmock, PDBS, "batch-workers"))  # applied last
        deployment = stored(kmock, DEPLOYMENTS, "batch-workers")
        service = stored(kmock, SERVICES, "batch-metrics")
        pdb = stored(kmock, PDBS, "batch-workers")
        for obj in (deployment, service, pdb):
            assert obj["metadata"]["ownerReferences"] == [OWNER]
        assert deployment["spec"]["replicas"] == 1
        await eventually(lambda: pool_status(kmock)["observedGeneration"] == 1)
        await eventually(lambda: "queue" in pool_status(kmock))
        status = pool_status(kmock)
        assert status["pool"] == "batch"
        assert status["selector"] == ("app.kubernetes.io/component=worker,"
                                      "runlease.dev/agentrunpool=batch")
        assert status["queue"] == {"pending": 0, "leased": 0, "dead": 0,
                                   "oldestPendingSeconds": 0.0}
        assert condition(kmock, "Degraded")["status"] == "False"
        assert {c["observedGeneration"] for c in status["conditions"]} == {1}
        assert {c["type"] for c in status["conditions"]} == {
            "Ready", "Progressing", "Degraded", "LeasesHealthy", "Paused"}
        # The pool's row and tenant limits reached the database.
        with psycopg.connect(db_url) as conn:
            pools = conn.execute("SELECT name, max_attempts, lease_s, default_max_in_flight,"
                                 " retention_s, paused, tool_env"
                                 " FROM agent_run_pools ORDER BY name").fetchall()
            limits = conn.execute("SELECT tenant_id, max_in_flight, priority_min, priority_max,"
                                  " submits_per_minute, tokens_per_minute"
                                  " FROM agent_run_tenant_limits"
                                  " WHERE pool = 'batch' ORDER BY tenant_id").fetchall()
        assert ("batch", 3, 45, 3, 3600, True, ["GITHUB_TOKEN", "HTTPS_PROXY"]) in pools
        assert limits == [("low", None, -10, 0, 60, 50_000), ("vip", 10, None, None, None, None)]
        # The operator's own calls all went through the kubernetes client
        # (kopf's watches and status patches are kopf's).
        calls = [r for r in list(kmock)
                 if r.resource in (DEPLOYMENTS, SERVICES, PDBS, "v1/secrets")]
        kopfs = [r for r in calls if r.headers.get("User-Agent", "").startswith("kopf")]
        # kopf only watches Deployments (method and resource compare equal to strings).
        assert all(r.method == "GET" and r.resource == DEPLOYMENTS and r.name is None
                   for r in kopfs)
        ours = [r for r in calls if r not in kopfs]
        assert {r.method for r in ours} == {"GET", "PATCH", "POST"}
        assert all(r.headers.get("User-Agent", "").startswith("OpenAPI-Generator/")
                   for r in ours)
        # Both logged in from the one configuration (the kubeconfig's token).
        assert {r.headers.get("Authorization") for r in calls} == {"Bearer test-token"}
        patches = {r.headers.get("Content-Type") for r in ours if r.method == "PATCH"}
        assert patches == {"application/merge-patch+json"}


async def test_spec_updates_reach_the_deployment_and_the_database(
    kmock: Any, kubeconfig: str, db_url: str
) -> None:
    database_secret(kmock, db_url)
    async with running_operator(kmock):
        await create_pool(kmock, "batch",
                          tenants={"overrides": [{"tenant": "vip", "maxInFlight": 10},
                                                 {"tenant": "old", "maxInFlight": 1}]})
        await eventually(lambda: stored(kmock, DEPLOYMENTS, "batch-workers"))
        await kmock.patch(f"{POOLS_URL}/batch", headers=MERGE, json={
            "metadata": {"generation": 2},
            "spec": {"image": "ghcr.io/acme/agents:1.3", "maxAttempts": 5,
                     "tenants": {"overrides": [{"tenant": "vip", "maxInFlight": 20}]}}})

        def updated() -> bool:
            container = stored(kmock, DEPLOYMENTS, "batch-workers")["spec"]["template"][
                "spec"]["containers"][0]
            return container["image"] == "ghcr.io/acme/agents:1.3"

        await eventually(updated)
        await eventually(lambda: pool_status(kmock)["observedGeneration"] == 2)
        with psycopg.connect(db_url) as conn:
            limits = conn.execute("SELECT tenant_id, max_in_flight FROM agent_run_tenant_limits"
                                  " WHERE pool = 'batch'").fetchall()
            attempts = conn.execute("SELECT max_attempts FROM agent_run_pools"
                                    " WHERE name = 'batch'").fetchone()
        assert limits == [("vip", 20)]  # the removed override is removed
        assert attempts == (5,)
        assert not requests_of(kmock, method="PUT")  # patched, never replaced


async def test_replicas_follow_the_queue_and_scale_down_waits(
    kmock: Any, kubeconfig: str, db_url: str
) -> None:
    database_secret(kmock, db_url)
    async with running_operator(kmock):
        # One tenant's 35 runs, all startable: no default share (at 50% of
        # 5 x 10 slots, 25 of them would be, and 3 replicas the demand).
        await create_pool(kmock, "batch", concurrencyPerWorker=10,
                          replicas={"min": 1, "max": 5}, tenants={"defaultSharePercent": 100},
                          autoscaling={"targetRunsPerWorker": 1, "scaleDownDelaySeconds": 2})
        await eventually(lambda: stored(kmock, DEPLOYMENTS, "batch-workers"))
        await enqueue(db_url, "batch", 35)

        def replicas() -> int:
            return int(stored(kmock, DEPLOYMENTS, "batch-workers")["spec"]["replicas"])

        await eventually(lambda: replicas() == 4)  # ceil(35 / 10), at once
        await eventually(lambda: pool_status(kmock).get("queue", {}).get("pending") == 35)
        assert pool_status(kmock)["desiredReplicas"] == 4
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("UPDATE agent_runs SET status = 'cancelled', finished_at = now(),"
                         " cancel_requested_at = now() WHERE pool = 'batch'")
        started = asyncio.get_running_loop().time()
        await eventually(lambda: pool_status(kmock).get("scaleDownSince"))
        assert replicas() == 4  # lower demand, but the delay has not passed
        await eventually(lambda: replicas() == 1, wait_s=10)
        waited = asyncio.get_running_loop().time() - started
        assert waited >= 1.5

        def reasons() -> set[str]:
            events = [r.data for r in requests_of(kmock, method="POST", resource="v1/events")]
            return {e.get("reason") for e in events if isinstance(e, dict)}

        await eventually(lambda: {"ScaledUp", "ScaledDown"} <= reasons())


async def test_pod_deletion_cost_comes_from_leases(kmock: Any, kubeconfig: str,
                                                   db_url: str) -> None:
    database_secret(kmock, db_url)
    labels = {"runlease.dev/agentrunpool": "batch", "app.kubernetes.io/component": "worker"}
    for name, uid in (("busy", "uid-pod-busy"), ("idle", "uid-pod-idle")):
        kmock.objects[PODS, NS, f"batch-workers-{name}"] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"batch-workers-{name}", "namespace": NS, "uid": uid,
                         "labels": labels},
            "spec": {"containers": [{"name": "worker", "image": "x"}]}}
    async with running_operator(kmock):
        await create_pool(kmock, "batch", concurrencyPerWorker=2, replicas={"min": 1, "max": 3},
                          tenants={"defaultSharePercent": 100},  # one tenant fills it
                          autoscaling={"scaleDownDelaySeconds": 0})
        await eventually(lambda: stored(kmock, DEPLOYMENTS, "batch-workers"))
        await enqueue(db_url, "batch", 6)
        await eventually(lambda: stored(kmock, DEPLOYMENTS, "batch-workers")["spec"][
            "replicas"] == 3)
        async with make_conn_pool(db_url, max_size=1) as conn_pool:
            store = RegisteringStore(conn_pool)
            leases = await store.claim("batch", "uid-pod-busy:boot:1", 2)
            await store.request_cancel((await store.list_runs(status="pending"))[0].id)
            for run in await store.list_runs(status="pending"):
                await store.request_cancel(run.id)
        assert len(leases) == 2

        def costs() -> dict[str, str]:
            out = {}
            for name in ("busy", "idle"):
                pod = stored(kmock, PODS, f"batch-workers-{name}")
                cost = pod["metadata"].get("annotations", {}).get(
                    "controller.kubernetes.io/pod-deletion-cost")
                out[name] = cost
            return out

        await eventually(lambda: costs() == {"busy": "2", "idle": "0"})
        await eventually(lambda: stored(kmock, DEPLOYMENTS, "batch-workers")["spec"][
            "replicas"] == 1)


async def test_a_deleted_or_edited_deployment_is_put_back(kmock: Any, kubeconfig: str,
                                                          db_url: str) -> None:
    database_secret(kmock, db_url)
    async with running_operator(kmock):
        await create_pool(kmock, "batch")
        await eventually(lambda: stored(kmock, DEPLOYMENTS, "batch-workers"))
        await kmock.patch(f"/apis/apps/v1/namespaces/{NS}/deployments/batch-workers",
                          headers=MERGE, json={"spec": {"template": {"spec": {
                              "terminationGracePeriodSeconds": 1}}}})

        def grace() -> int:
            return int(stored(kmock, DEPLOYMENTS, "batch-workers")["spec"]["template"]["spec"][
                "terminationGracePeriodSeconds"])

        await eventually(lambda: grace() == 60)
        await kmock.delete(f"/apis/apps/v1/namespaces/{NS}/deployments/batch-workers")
        await eventually(lambda: not kmock.objects[DEPLOYMENTS, NS, "batch-workers"].deleted)
        history = kmock.objects[DEPLOYMENTS, NS, "batch-workers"].history
        assert None in history  # deleted, then created again
        assert stored(kmock, DEPLOYMENTS, "batch-workers")["metadata"]["ownerReferences"] == [
            OWNER]


async def test_an_invalid_spec_is_degraded_with_the_message(kmock: Any, kubeconfig: str,
                                                            db_url: str) -> None:
    database_secret(kmock, db_url)
    async with running_operator(kmock):
        await create_pool(kmock, "broken", lease={"durationSeconds": 10,
                                                  "heartbeatSeconds": 6})
        await eventually(lambda: condition(kmock, "Degraded", "broken")["status"] == "True")
        degraded = condition(kmock, "Degraded", "broken")
        assert degraded["reason"] == "InvalidSpec"
        assert "heartbeatSeconds" in degraded["message"]
        await eventually(lambda: any(
            isinstance(r.data, dict) and r.data.get("reason") == "InvalidSpec"
            for r in requests_of(kmock, method="POST", resource="v1/events")))
        assert DEPLOYMENTS not in {str(r.resource) for r in requests_of(kmock, method="POST")}


async def test_an_unsandboxed_pool_for_every_tenant_is_refused_unless_named(
        kmock: Any, kubeconfig: str, db_url: str) -> None:
    """An AgentRunPool author turns the tool sandbox off: refused (no worker
    Deployment), unless the operator's admin listed the pool by name."""
    database_secret(kmock, db_url)
    async with running_operator(kmock, unsandboxed_pools=(f"{NS}/allowed",)):
        await create_pool(kmock, "open", toolSandbox={"enabled": False})
        await eventually(lambda: condition(kmock, "Degraded", "open")["status"] == "True")
        degraded = condition(kmock, "Degraded", "open")
        assert degraded["reason"] == "InvalidSpec"
        assert "--unsandboxed-pools" in degraded["message"]
        await create_pool(kmock, "allowed", toolSandbox={"enabled": False})
        deployment = await eventually(lambda: stored(kmock, DEPLOYMENTS, "allowed-workers"))
        env = {e["name"]: e.get("value") for e in
               deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["RUNLEASE_UNSANDBOXED_POOL"] == "allowed"
        assert "open-workers" not in {str(r.name) for r in
                                      requests_of(kmock, method="POST")
                                      if str(r.resource) == DEPLOYMENTS}


async def test_a_missing_secret_is_retried_until_it_exists(kmock: Any, kubeconfig: str,
                                                            db_url: str) -> None:
    async with running_operator(kmock):
        await create_pool(kmock, "batch")
        await eventually(lambda: condition(kmock, "Degraded")["reason"] == "SecretMissing")
        assert "no Secret 'db'" in condition(kmock, "Degraded")["message"]
        await eventually(lambda: any(
            isinstance(r.data, dict) and r.data.get("reason") == "SecretMissing"
            and r.data.get("type") == "Warning"
            for r in requests_of(kmock, method="POST", resource="v1/events")))
        database_secret(kmock, db_url)  # applied after the pool, as kubectl apply -f dir/ may
        await eventually(lambda: stored(kmock, DEPLOYMENTS, "batch-workers"), wait_s=20)


async def test_two_operators_elect_one_reaper(kmock: Any, kubeconfig: str,
                                              db_url: str) -> None:
    async with running_operator(kmock, db_url), running_operator(kmock, db_url):
        def leaders() -> list[tuple[Any, ...]]:
            with psycopg.connect(db_url) as conn:
                return conn.execute("SELECT leader_id FROM runlease_leaders"
                                    " WHERE expires_at > now()").fetchall()

        await eventually(lambda: len(leaders()) == 1)
        first = leaders()
        await asyncio.sleep(1)
        assert leaders() == first  # one leader, the same one, while both run
        assert first[0][0].startswith("operator-")


async def test_a_hostile_name_reaches_nothing_outside_the_namespace(
    kmock: Any, kubeconfig: str, db_url: str
) -> None:
    database_secret(kmock, db_url)
    # What the hostile names aim at: another namespace's database Secret.
    kmock.objects["v1/secrets", "kube-system", "db"] = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "kube-system", "uid": "uid-system-db"},
        "data": {"url": base64.b64encode(db_url.encode()).decode()}}
    pools = {f"hostile-{i}": name for i, name in enumerate(HOSTILE_NAMES)}
    async with running_operator(kmock):
        for pool, name in pools.items():
            await create_pool(kmock, pool, database={"secretKeyRef": {"name": name}},
                              imagePullSecrets=[{"name": name}])
        for pool in pools:
            await eventually(lambda p=pool: condition(kmock, "Degraded", p)["status"] == "True")
            degraded = condition(kmock, "Degraded", pool)
            assert degraded["reason"] == "InvalidSpec"
            assert degraded["message"].startswith("spec.database.secretKeyRef.name must be")
    elsewhere = [f"{r.method} {r.url}" for r in list(kmock)
                 if r.namespace not in (None, NS)]
    assert elsewhere == []
    assert requests_of(kmock, resource="v1/secrets") == []
    assert not requests_of(kmock, method="POST", resource=DEPLOYMENTS)


async def test_replicas_follow_work_that_can_start(kmock: Any, kubeconfig: str,
                                                   db_url: str) -> None:
    database_secret(kmock, db_url)
    async with running_operator(kmock):
        await create_pool(kmock, "batch", concurrencyPerWorker=1,
                          replicas={"min": 1, "max": 10},
                          autoscaling={"scaleDownDelaySeconds": 0},
                          tenants={"overrides": [{"tenant": "capped", "maxInFlight": 2}]})
        await eventually(lambda: stored(kmock, DEPLOYMENTS, "batch-workers"))
        await enqueue(db_url, "batch", 1000, tenant="capped")
        await enqueue(db_url, "batch", 3, tenant="free")
        await eventually(lambda: pool_status(kmock).get("queue", {}).get("pending") == 1003)
        # 2 of the capped tenant's 1,000 can start, and the free tenant's 3:
        # five workers of one slot each, not the ten a raw count asks for.
        assert pool_status(kmock)["desiredReplicas"] == 5
        assert stored(kmock, DEPLOYMENTS, "batch-workers")["spec"]["replicas"] == 5
        await kmock.patch(f"{POOLS_URL}/batch", headers=MERGE, json={
            "metadata": {"generation": 2}, "spec": {"paused": True}})
        assert condition(kmock, "Paused")["status"] == "False"
        # A paused pool starts nothing: its backlog asks for no worker.
        await eventually(lambda: pool_status(kmock).get("desiredReplicas") == 1)
        await eventually(lambda: condition(kmock, "Paused")["observedGeneration"] == 2)
        paused = condition(kmock, "Paused")
        assert (paused["status"], paused["reason"]) == ("True", "SpecPaused")


async def test_pools_of_one_name_in_two_namespaces_are_not_merged(
    kmock: Any, kubeconfig: str, db_url: str
) -> None:
    other = "rl-other"
    database_secret(kmock, db_url)
    database_secret(kmock, db_url, ns=other)

    def owner() -> Any:
        with psycopg.connect(db_url) as conn:
            return conn.execute("SELECT owner, max_attempts FROM agent_run_pools"
                                " WHERE name = 'support'").fetchone()

    async with running_operator(kmock, namespaces=f"{NS},{other}"):
        await create_pool(kmock, "support", maxAttempts=4)
        await eventually(lambda: stored(kmock, DEPLOYMENTS, "support-workers"))
        assert owner() == (f"{NS}/support", 4)
        await create_pool(kmock, "support", ns=other, maxAttempts=9)
        await eventually(lambda: condition(kmock, "Degraded", "support", other)[
            "reason"] == "PoolTaken")
        message = condition(kmock, "Degraded", "support", other)["message"]
        assert f"belongs to AgentRunPool {NS}/support" in message
        assert "spec.pool" in message
        # A few passes later: still the first pool's settings, no second set of workers.
        await asyncio.sleep(1)
        assert owner() == (f"{NS}/support", 4)
        assert not [r for r in requests_of(kmock, method="POST", resource=DEPLOYMENTS)
                    if r.namespace == other]
        # The first one deleted, the pool is free and the second takes it.
        await kmock.delete(f"{POOLS_URL}/support")
        await eventually(lambda: owner() in ((None, 4), (f"{other}/support", 9)))
        await eventually(lambda: owner() == (f"{other}/support", 9), wait_s=30)
        await eventually(lambda: stored(kmock, DEPLOYMENTS, "support-workers", other))
