"""The databases the operator talks to: its own, and those pools name.

A pool's Secret holds its database URL. The operator keeps one connection
pool (and, when it hosts the reaper, one leader election and reaper) per
distinct URL, so ten pools on one database share one of each.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict

from runlease.db.connect import make_conn_pool
from runlease.db.store import RunStore
from runlease.operator.k8s import Kubernetes
from runlease.operator.spec import PoolSpec
from runlease.services.leader import LeaderElector
from runlease.services.reaper import Reaper
from runlease.services.scheduler import Scheduler
from runlease.services.webhooks import WebhookDispatcher
from runlease.settings import OperatorSettings

log = logging.getLogger(__name__)


class SecretMissing(RuntimeError):
    """The pool's database Secret (or its key) does not exist yet: retried,
    since it may well be applied after the pool."""


@dataclass
class Database:
    store: RunStore
    elector: LeaderElector | None
    reaper: Reaper | None
    scheduler: Scheduler | None = None
    webhooks: WebhookDispatcher | None = None


class Databases:
    def __init__(self, settings: OperatorSettings, identity: str) -> None:
        self.settings = settings
        self.identity = identity
        self._by_url: dict[str, Database] = {}

    async def start(self) -> None:
        if self.settings.database_url:
            await self.for_url(self.settings.database_url,
                               prepare=self.settings.prepared_statements)

    async def for_url(self, url: str, *, prepare: bool = True) -> Database:
        """The URL's database; `prepare` (server-side prepared statements) is
        what the first caller asked for: off for a URL through PgBouncer in
        transaction mode."""
        found = self._by_url.get(url)
        if found is not None:
            return found
        conn_pool = make_conn_pool(url, min_size=1, max_size=5,
                                   application_name="runlease-operator", prepare=prepare)
        await conn_pool.open(wait=False)
        store = RunStore(conn_pool)
        s = self.settings
        elector = reaper = scheduler = webhooks = None
        if s.reaper:
            elector = LeaderElector(store, self.identity, ttl_s=s.leader_ttl_s)
            reaper = Reaper(store, elector, interval_s=s.reaper_interval_s)
            elector.start()
            reaper.start()
            scheduler = Scheduler(store, elector)
            scheduler.start()
            webhooks = WebhookDispatcher(store, elector, interval_s=min(1.0, s.reaper_interval_s),
                                           limits=s.webhook_limits())
            webhooks.start()
        db = self._by_url[url] = Database(store, elector, reaper, scheduler, webhooks)
        log.info("database_added reaper=%s", bool(reaper))
        return db

    async def for_pool(self, k8s: Kubernetes, spec: PoolSpec) -> Database:
        data = await k8s.secret_data(spec.namespace, spec.database_secret)
        if data is None:
            raise SecretMissing(f"spec.database.secretKeyRef: no Secret "
                                f"{spec.database_secret!r} in {spec.namespace}")
        encoded = data.get(spec.database_key)
        if not encoded:
            raise SecretMissing(f"spec.database.secretKeyRef: Secret {spec.database_secret!r} "
                                f"has no key {spec.database_key!r}")
        return await self.for_url(base64.b64decode(encoded).decode(),
                                  prepare=spec.prepared_statements)

    @property
    def count(self) -> int:
        return len(self._by_url)

    async def unreachable(self, timeout_s: float) -> list[str]:
        """The databases that do not answer SELECT 1 within timeout_s, each
        as host:port/dbname (never the URL: it may hold a password)."""

        async def answers(db: Database) -> bool:
            try:
                async with db.store.connection() as conn:
                    await conn.execute("SELECT 1")
            except Exception:  # unreachable, whatever the reason
                return False
            return True

        dbs = list(self._by_url.items())
        results = await asyncio.gather(*(asyncio.wait_for(answers(db), timeout_s)
                                         for _, db in dbs), return_exceptions=True)
        return [where(url) for (url, _), ok in zip(dbs, results, strict=True) if ok is not True]

    async def close(self) -> None:
        for db in self._by_url.values():
            for service in (db.webhooks, db.scheduler, db.reaper, db.elector):
                if service is not None:
                    await service.stop(2)
            await db.store.conn_pool.close()
        self._by_url.clear()


def where(url: str) -> str:
    try:
        info = conninfo_to_dict(url)
    except Exception:  # a URL psycopg cannot parse would not have connected either
        return "(unparsable URL)"
    return f"{info.get('host', '')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
