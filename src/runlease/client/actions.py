"""Bulk cancel and redrive and re-prioritising, for both clients (mixed
into Client and AsyncClient; each gives `_send`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import httpx

from runlease.client.calls import Call, check, sends
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


def _bulk(response: httpx.Response) -> BulkView:
    return BulkView.from_json(check(response))


def _run(response: httpx.Response) -> RunView:
    return RunView.from_json(check(response))


def _bulk_call(action: str, ids: Sequence[UUID | str] | None, status: Sequence[str] | None,
               pool: str | None, tenant_id: str | None, label: Sequence[str] | None,
               dry_run: bool) -> Call[BulkView]:
    return Call("POST", f"/v1/runs/{action}", _bulk, json=bulk_body(
        ids, status, pool, tenant_id, dry_run, label))


class Actions:
    """Each method declares its call once; `sends` makes it both clients'."""

    @sends
    def bulk_cancel(ids: Sequence[UUID | str] | None = None, *,
                    status: Sequence[str] | None = None, pool: str | None = None,
                    tenant_id: str | None = None, label: Sequence[str] | None = None,
                    dry_run: bool = False) -> Call[BulkView]:
        """Cancel the runs named by `ids` (at most 1,000), or else those
        matching status/pool (and, for admins, tenant_id)."""
        return _bulk_call("cancel", ids, status, pool, tenant_id, label, dry_run)

    @sends
    def bulk_redrive(ids: Sequence[UUID | str] | None = None, *,
                     status: Sequence[str] | None = None, pool: str | None = None,
                     tenant_id: str | None = None, label: Sequence[str] | None = None,
                     dry_run: bool = False) -> Call[BulkView]:
        """Redrive the dead runs named by `ids`, or else those matching (admin only)."""
        return _bulk_call("redrive", ids, status, pool, tenant_id, label, dry_run)

    @sends
    def reprioritize(run_id: UUID | str, priority: int) -> Call[RunView]:
        """A pending run's new priority (within the tenant's band)."""
        return Call("PATCH", f"/v1/runs/{run_id}", _run, json={"priority": priority})
