"""Bulk cancel and redrive and re-prioritising, for both clients (mixed
into Client and AsyncClient; each gives `_call`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from runlease.client.views import RunView


@dataclass(frozen=True, slots=True)
class BulkView:
    """What a bulk action did (or, for a dry run, would do)."""

    op_id: UUID
    action: str
    dry_run: bool
    matched: int
    affected: int
    ids: list[UUID]
    truncated: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BulkView:
        return cls(op_id=UUID(data["op_id"]), action=data["action"], dry_run=data["dry_run"],
                   matched=data["matched"], affected=data["affected"],
                   ids=[UUID(i) for i in data["ids"]], truncated=data["truncated"])


def bulk_body(ids: Sequence[UUID | str] | None, status: Sequence[str] | None,
              pool: str | None, tenant_id: str | None, dry_run: bool,
              label: Sequence[str] | None = None) -> dict[str, Any]:
    """`ids`, or else a filter of the other arguments (an empty filter: every
    run the action applies to). `label` items are `key:value`."""
    if ids is not None:
        return {"ids": [str(i) for i in ids], "dry_run": dry_run}
    where: dict[str, Any] = {}
    for key, value in (("status", list(status or ())), ("pool", pool),
                       ("tenant_id", tenant_id), ("label", list(label or ()))):
        if value:
            where[key] = value
    return {"filter": where, "dry_run": dry_run}


class SyncActions:
    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        raise NotImplementedError

    def bulk_cancel(self, ids: Sequence[UUID | str] | None = None, *,
                    status: Sequence[str] | None = None, pool: str | None = None,
                    tenant_id: str | None = None, label: Sequence[str] | None = None,
                    dry_run: bool = False) -> BulkView:
        """Cancel the runs named by `ids` (at most 1,000), or else those
        matching status/pool (and, for admins, tenant_id)."""
        return BulkView.from_json(self._call("POST", "/v1/runs/cancel", json=bulk_body(
            ids, status, pool, tenant_id, dry_run, label)))

    def bulk_redrive(self, ids: Sequence[UUID | str] | None = None, *,
                     status: Sequence[str] | None = None, pool: str | None = None,
                     tenant_id: str | None = None, label: Sequence[str] | None = None,
                     dry_run: bool = False) -> BulkView:
        """Redrive the dead runs named by `ids`, or else those matching."""
        return BulkView.from_json(self._call("POST", "/v1/runs/redrive", json=bulk_body(
            ids, status, pool, tenant_id, dry_run, label)))

    def reprioritize(self, run_id: UUID | str, priority: int) -> RunView:
        """A pending run's new priority (within the tenant's band)."""
        return RunView.from_json(self._call("PATCH", f"/v1/runs/{run_id}",
                                            json={"priority": priority}))


class AsyncActions:
    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def bulk_cancel(self, ids: Sequence[UUID | str] | None = None, *,
                          status: Sequence[str] | None = None, pool: str | None = None,
                          tenant_id: str | None = None, label: Sequence[str] | None = None,
                          dry_run: bool = False) -> BulkView:
        return BulkView.from_json(await self._call("POST", "/v1/runs/cancel", json=bulk_body(
            ids, status, pool, tenant_id, dry_run, label)))

    async def bulk_redrive(self, ids: Sequence[UUID | str] | None = None, *,
                           status: Sequence[str] | None = None, pool: str | None = None,
                           tenant_id: str | None = None, label: Sequence[str] | None = None,
                           dry_run: bool = False) -> BulkView:
        return BulkView.from_json(await self._call("POST", "/v1/runs/redrive", json=bulk_body(
            ids, status, pool, tenant_id, dry_run, label)))

    async def reprioritize(self, run_id: UUID | str, priority: int) -> RunView:
        return RunView.from_json(await self._call("PATCH", f"/v1/runs/{run_id}",
                                                  json={"priority": priority}))
