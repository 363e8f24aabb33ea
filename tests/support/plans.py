"""Executed plans, read through auto_explain: rows read are counted from
EXPLAIN ANALYZE, never timed."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from runlease.db.store import Conn, RunStore


@dataclass(frozen=True)
class Executed:
    """One statement's text and its executed plan."""

    text: str
    plan: dict[str, Any]


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in nodes(child))]


def reads(plan: dict[str, Any], relation: str = "agent_runs") -> int:
    """Rows the scans of `relation` in one executed plan returned or filtered out."""
    n = 0
    if plan.get("Relation Name") == relation and plan.get("Node Type") != "ModifyTable":
        n += int(plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1))
        n += int(plan.get("Rows Removed by Filter", 0))
        n += int(plan.get("Rows Removed by Index Recheck", 0))
    return n + sum(reads(child, relation) for child in plan.get("Plans", []))


def indexes(plan: dict[str, Any], relation: str = "agent_runs") -> set[str]:
    """The indexes a plan scans `relation` by."""
    return {n["Index Name"] for n in nodes(plan)
            if "Index Name" in n and (n.get("Relation Name") == relation
                                      or (n["Node Type"] == "Bitmap Index Scan"
                                          and n["Index Name"].startswith(relation + "_")))}


def seq_scans(plan: dict[str, Any], relation: str = "agent_runs") -> int:
    return sum(1 for n in nodes(plan)
               if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == relation)


async def executed(store: RunStore, call: Callable[[Conn], Awaitable[Any]], *,
                   before: Callable[[Conn], Awaitable[Any]] | None = None,
                   rollback: bool = True) -> tuple[Any, list[Executed]]:
    """What `call` returned and the executed plans of every statement it
    sent, nested ones (inside functions) included; `before` runs first in
    the same transaction, unexplained. The transaction is rolled back
    afterwards unless told otherwise, so the database stays as it was."""
    found: list[Executed] = []

    def notice(diag: Any) -> None:
        message = diag.message_primary or ""
        if "plan:" in message:
            doc = json.loads(message.split("plan:", 1)[1])
            found.append(Executed(doc.get("Query Text", ""), doc["Plan"]))

    async with store.connection() as conn:
        await conn.execute("LOAD 'auto_explain'")
        conn.add_notice_handler(notice)
        try:
            async with conn.transaction(force_rollback=rollback):
                if before is not None:
                    await before(conn)
                for name, value in [("log_min_duration", "0"), ("log_analyze", "on"),
                                    ("log_nested_statements", "on"), ("log_format", "json"),
                                    ("log_level", "notice")]:
                    await conn.execute(f"SET LOCAL auto_explain.{name} = {value}")  # type: ignore[arg-type]
                result = await call(conn)
        finally:
            conn.remove_notice_handler(notice)
    return result, found
