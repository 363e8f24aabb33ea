"""kopf handlers: thin. They read the AgentRunPool, call the pure builders and
the autoscaler, apply what those return, and write status.

    create / update / resume   pool row and tenant limits in the database;
                               Deployment, Service and PDB applied (patch,
                               never replace); a bad spec is a PermanentError
                               shown in status and as an Event
    timer                      one pass (pool_pass.py: observe, decide, act,
                               report): demand -> replicas, drift repaired,
                               status and gauges
    delete (optional)          the pool row's owner released (ownership.py)
    Deployment DELETED         put back at once
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes.config import ConfigException

from runlease import metrics
from runlease.client.errors import ApiError
from runlease.db.models import Pool
from runlease.errors import RunleaseError
from runlease.operator import build, ownership, pool_pass
from runlease.operator import status as st
from runlease.operator.databases import Databases, SecretMissing
from runlease.operator.health import Health
from runlease.operator.k8s import Kubernetes, connection_info, load_configuration
from runlease.operator.ownership import PoolTaken
from runlease.operator.spec import InvalidSpec, PoolSpec, check_sandbox, parse
from runlease.services.http import ProbeServer
from runlease.services.identity import boot_id
from runlease.settings import OperatorSettings

log = logging.getLogger(__name__)

PLURAL = "agentrunpools"
TICK_S = 0.5  # the timer's own pace; each pool's pass runs every settings.interval_s
POOL_TAKEN_RETRY_S = 15  # a refused pool is tried again: its owner may have gone
TRANSIENT = (ApiError, RunleaseError, TimeoutError, SecretMissing)


def now() -> datetime:
    return datetime.now(UTC)


def credentials() -> kopf.ConnectionInfo | None:
    """kopf's credentials: the kubernetes client's configuration (in-cluster,
    else KUBECONFIG, read now), so kopf and the client log in alike."""
    try:
        return connection_info(load_configuration())
    except (ConfigException, OSError) as exc:
        log.warning("kubernetes_credentials_missing error=%s", exc)
        return None


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo | None:
    return credentials()


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any,
                  **_: Any) -> None:
    config: OperatorSettings = memo.config
    # Handler progress in annotations: the CRD's structural schema would prune
    # kopf's default status.kopf fields.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="runlease.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="runlease.dev", key="last-handled-configuration")
    try:
        memo.k8s = Kubernetes(load_configuration())
    except (ConfigException, OSError) as exc:
        raise kopf.PermanentError(f"no Kubernetes credentials (service account or "
                                  f"KUBECONFIG): {exc}") from exc
    who = os.environ.get("POD_NAME") or socket.gethostname()
    memo.dbs = Databases(config, f"operator-{who}:{boot_id()}:{os.getpid()}")
    await memo.dbs.start()
    memo.low_since = {}
    memo.last_pass = {}
    memo.probes = None
    if config.metrics_port:
        started: asyncio.Event | None = getattr(memo, "started", None)
        health = Health(memo.dbs, memo.k8s,
                        None if config.all_namespaces else config.namespaces[0],
                        started=lambda: started is None or started.is_set())
        memo.probes = ProbeServer(config.metrics_host, config.metrics_port,
                                  health=health.live, ready=health.ready)
        await memo.probes.start()


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    if getattr(memo, "probes", None) is not None:
        await memo.probes.stop()
    if getattr(memo, "dbs", None) is not None:
        await memo.dbs.close()
    if getattr(memo, "k8s", None) is not None:
        await memo.k8s.close()


async def apply_pool(body: dict[str, Any], memo: kopf.Memo) -> PoolSpec:
    """Database rows, then manifests. Raises InvalidSpec for a bad spec."""
    meta = body["metadata"]
    spec = parse(meta["name"], meta["namespace"], body.get("spec") or {})
    config: OperatorSettings = memo.config
    check_sandbox(spec, config.unsandboxed_pools)
    db = await memo.dbs.for_pool(memo.k8s, spec)
    # Another namespace's AgentRunPool of the same pool name must not take
    # over this pool's queue and settings (ownership.py).
    await ownership.claim(db.store, spec)
    # The pool row is the one source workers and the reaper read (lease,
    # retention, pause, tool env): the spec writes all of it.
    await db.store.put_pool(Pool(spec.pool, spec.max_attempts, spec.lease_s,
                                 spec.default_max_in_flight, spec.priority_aging_s,
                                 spec.retention_s, spec.paused, spec.tool_env),
                            spec.tenant_overrides)
    await db.store.replace_key_limits(spec.pool, spec.key_limits)
    replicas = await pool_pass.first_replicas(spec, memo.k8s, db)
    for obj in build.objects(spec, body, replicas):
        await memo.k8s.apply(obj)
    return spec


@kopf.on.resume(build.GROUP, build.VERSION, PLURAL)
@kopf.on.create(build.GROUP, build.VERSION, PLURAL)
@kopf.on.update(build.GROUP, build.VERSION, PLURAL)
async def reconcile(body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo,
                    **_: Any) -> None:
    generation = meta.get("generation")
    try:
        spec = await apply_pool(dict(body), memo)
    except InvalidSpec as exc:
        metrics.RECONCILE_ERRORS.labels("invalid_spec").inc()
        patch.status.update(st.invalid(str(exc), generation, now(), dict(body.status)))
        kopf.warn(body, reason="InvalidSpec", message=str(exc))
        raise kopf.PermanentError(str(exc)) from None
    except PoolTaken as exc:
        metrics.RECONCILE_ERRORS.labels(ownership.REASON).inc()
        patch.status.update(st.invalid(str(exc), generation, now(), dict(body.status),
                                       reason=ownership.REASON))
        kopf.warn(body, reason=ownership.REASON, message=str(exc))
        raise kopf.TemporaryError(str(exc), delay=POOL_TAKEN_RETRY_S) from None
    except TRANSIENT as exc:
        metrics.RECONCILE_ERRORS.labels(type(exc).__name__).inc()
        patch.status.update(st.invalid(str(exc), generation, now(), dict(body.status),
                                       reason=type(exc).__name__))
        # A database or API error, as an Event too (the API server folds
        # repeats of one message into a count).
        kopf.warn(body, reason=type(exc).__name__, message=str(exc)[:500])
        raise kopf.TemporaryError(f"reconcile failed: {exc}", delay=5) from exc
    patch.status["observedGeneration"] = generation
    patch.status["selector"] = build.selector_string(spec)
    patch.status["pool"] = spec.pool
    log.info("pool_reconciled name=%s pool=%s generation=%s", spec.name, spec.pool, generation)


@kopf.timer(build.GROUP, build.VERSION, PLURAL, interval=TICK_S, initial_delay=TICK_S)
async def tick(body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo,
               **_: Any) -> None:
    key = (meta["namespace"], meta["name"])
    config: OperatorSettings = memo.config
    if time.monotonic() - memo.last_pass.get(key, 0.0) < config.interval_s:
        return
    memo.last_pass[key] = time.monotonic()
    try:
        spec = parse(meta["name"], meta["namespace"], dict(body.spec))
    except InvalidSpec:
        return  # reconcile reported it; nothing to scale
    try:
        db = await memo.dbs.for_pool(memo.k8s, spec)
        observed = await pool_pass.run(dict(body), spec, memo.k8s, db,
                                       lease_window_s=config.lease_window_s,
                                       low_since=memo.low_since)
    except PoolTaken as exc:
        # reconcile reported it (with an Event); keep the status saying so.
        patch.status.update(st.invalid(str(exc), None, now(), dict(body.status),
                                       condition_generation=meta.get("generation"),
                                       reason=ownership.REASON))
        return
    except TRANSIENT as exc:
        metrics.RECONCILE_ERRORS.labels(type(exc).__name__).inc()
        log.warning("pool_pass_failed name=%s error=%s", spec.name, exc)
        kopf.warn(body, reason="ReconcileError", message=str(exc)[:500])
        return
    if observed is not None:
        patch.status.update(observed)


@kopf.on.event("apps", "v1", "deployments", labels={build.OWNER_LABEL: kopf.PRESENT})
async def deployment_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                           **_: Any) -> None:
    """A worker Deployment was deleted by hand: put it back now, not at the next pass."""
    if event.get("type") != "DELETED":
        return
    meta = body.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(build.OWNER_LABEL)
    namespace = meta.get("namespace")
    if not isinstance(owner, str) or not isinstance(namespace, str):
        return
    pool = await memo.k8s.pool(namespace, owner)
    if pool is None or (pool.get("metadata") or {}).get("deletionTimestamp"):
        return  # the pool is gone: the Deployment went with it
    try:
        await apply_pool(pool, memo)
        log.warning("deployment_recreated pool=%s namespace=%s", owner, namespace)
        kopf.info(cast(kopf.Body, pool), reason="Recreated",
                  message="the worker Deployment was deleted; recreated")
    except (InvalidSpec, PoolTaken):
        return


@kopf.on.delete(build.GROUP, build.VERSION, PLURAL, optional=True)
async def deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The pool's runs and row stay (docs/operator.md); its ownership goes,
    so an AgentRunPool elsewhere may name the pool. Best effort, without a
    finalizer: an operator that misses the deletion leaves the owner set."""
    meta = body.get("metadata") or {}
    try:
        spec = parse(meta["name"], meta["namespace"], dict(body.spec))
        db = await memo.dbs.for_pool(memo.k8s, spec)
        await ownership.release(db.store, spec)
    except (InvalidSpec, *TRANSIENT) as exc:
        log.warning("pool_release_failed name=%s error=%s", meta.get("name"), exc)
        return
    log.info("pool_released name=%s namespace=%s pool=%s", spec.name, spec.namespace, spec.pool)
