"""`runlease operator`: kopf with our handlers, login and settings."""

from __future__ import annotations

import asyncio
import logging
import random
import threading

import kopf

from runlease.settings import OperatorSettings

log = logging.getLogger(__name__)


def kopf_settings(config: OperatorSettings) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.posting.level = logging.INFO
    settings.peering.name = config.peering_name
    settings.peering.standalone = config.standalone
    settings.peering.mandatory = not config.standalone
    settings.peering.clusterwide = config.all_namespaces
    # With peering, every replica needs its own priority: equal priorities
    # all pause, a different one makes the highest the active operator and
    # the others hot standbys. The reaper's leadership is separate, through
    # PostgreSQL, so it never depends on the Kubernetes API.
    settings.peering.priority = (config.priority if config.priority is not None
                                 else random.randint(1, 2**31 - 1))
    return settings


async def operator(config: OperatorSettings, *, settings: kopf.OperatorSettings | None = None,
                   stop_flag: asyncio.Event | threading.Event | None = None,
                   ready_flag: asyncio.Event | threading.Event | None = None) -> None:
    import runlease.operator.handlers  # noqa: F401 - registers the handlers

    settings = settings or kopf_settings(config)
    # kopf sets `started` once its startup handlers ran and its watches
    # began: /readyz waits for it (operator/health.py), and the caller's
    # ready_flag follows it.
    started = asyncio.Event()
    relay = None if ready_flag is None else asyncio.create_task(
        _follow(started, ready_flag), name="runlease ready relay")
    try:
        # Peering is configured through `settings` only: kopf.operator's own
        # peering_name argument would make peering mandatory even when standalone.
        await kopf.operator(
            settings=settings,
            clusterwide=config.all_namespaces,
            namespaces=list(config.namespaces),
            memo=kopf.Memo(config=config, started=started),
            stop_flag=stop_flag,
            ready_flag=started,
        )
    finally:
        if relay is not None:
            relay.cancel()


async def _follow(started: asyncio.Event,
                  ready_flag: asyncio.Event | threading.Event) -> None:
    await started.wait()
    ready_flag.set()


def run(config: OperatorSettings) -> None:
    asyncio.run(operator(config))
