"""Graph checkpoints (statements in sql/checkpoints.sql): LangGraph's state,
stored for the run that holds the lease (runlease.integrations.langgraph).

Bytes in, bytes out: what a checkpoint holds is the graph library's own
serialization, stored as it is (not redacted: it is the graph's state, read
back by the graph and never shown), bounded in size. The metadata is JSON,
so listing can filter on it. A write is fenced by the writer's lease and
names the tenant of the run; reads name the tenant and the thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from runlease.db.executor import Conn, Executor
from runlease.db.models import Lease
from runlease.errors import ValidationError

MAX_CHECKPOINT_BYTES = 4 * 1024 * 1024  # a checkpoint, its values inline
MAX_WRITE_BYTES = 4 * 1024 * 1024  # one value a task wrote
MAX_WRITES = 1000  # in one put_writes, and read back for a checkpoint
MAX_METADATA_BYTES = 64 * 1024
MAX_LIST = 1000
KEEP_PER_RUN = 16  # a run's newest checkpoints kept, per thread and namespace
MAX_THREAD_CHARS = 160  # 'thread:' and a thread's id
MAX_NS_CHARS = 512
MAX_ID_CHARS = 64


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    ns: str
    checkpoint_id: str
    parent_id: str | None
    type: str
    data: bytes
    metadata: dict[str, Any]
    run_id: UUID  # the run that wrote it


@dataclass(frozen=True, slots=True)
class StoredWrite:
    task_id: str
    channel: str
    type: str
    value: bytes


def _text(field: str, value: object, most: int, *, least: int = 1) -> str:
    if not isinstance(value, str) or not least <= len(value) <= most or "\x00" in value:
        raise ValidationError(field, f"must be a string of {least}-{most} characters")
    return value


def _blob(field: str, value: object, most: int) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValidationError(field, "must be bytes")
    data = bytes(value)
    if len(data) > most:
        raise ValidationError(field, f"is {len(data)} bytes, over the bound of {most}")
    return data


class CheckpointStore(Executor):
    """A run's graph checkpoints: fenced writes, reads by tenant and thread."""

    async def put_graph_checkpoint(
        self, lease: Lease, *, thread: str, ns: str, checkpoint_id: str,
        parent_id: str | None, type_: str, data: bytes, metadata: Mapping[str, Any],
        keep: int = KEEP_PER_RUN, conn: Conn | None = None,
    ) -> None:
        """Store a checkpoint (fenced: LeaseLost when the lease is gone);
        prunes the run's older checkpoints of the thread and namespace."""
        meta = json.dumps(dict(metadata), default=str, separators=(",", ":"))
        if len(meta.encode()) > MAX_METADATA_BYTES:
            raise ValidationError("metadata", f"is over the bound of {MAX_METADATA_BYTES} bytes")
        if not 1 <= keep <= 1000:
            raise ValidationError("keep", "must be between 1 and 1000")
        await self._fenced("graph_checkpoint_put", lease, {
            "thread": _text("thread", thread, MAX_THREAD_CHARS),
            "ns": _text("checkpoint_ns", ns, MAX_NS_CHARS, least=0),
            "checkpoint_id": _text("checkpoint_id", checkpoint_id, MAX_ID_CHARS),
            "parent_id": None if parent_id is None
            else _text("parent_id", parent_id, MAX_ID_CHARS),
            "type": _text("type", type_, 32),
            "checkpoint": _blob("checkpoint", data, MAX_CHECKPOINT_BYTES),
            "metadata": meta.replace("\\u0000", ""), "keep": keep,
        }, conn)

    async def put_graph_writes(
        self, lease: Lease, *, thread: str, ns: str, checkpoint_id: str, task_id: str,
        task_path: str, writes: Sequence[tuple[int, str, str, bytes]],
        conn: Conn | None = None,
    ) -> None:
        """Store a task's writes (idx, channel, type, value), fenced."""
        if not 1 <= len(writes) <= MAX_WRITES:
            raise ValidationError("writes", f"must be 1-{MAX_WRITES} writes")
        await self._fenced("graph_writes_put", lease, {
            "thread": _text("thread", thread, MAX_THREAD_CHARS),
            "ns": _text("checkpoint_ns", ns, MAX_NS_CHARS, least=0),
            "checkpoint_id": _text("checkpoint_id", checkpoint_id, MAX_ID_CHARS),
            "task_id": _text("task_id", task_id, 128),
            "task_path": _text("task_path", task_path, 1024, least=0),
            "idxs": [int(w[0]) for w in writes],
            "channels": [_text("channel", w[1], 256) for w in writes],
            "types": [_text("type", w[2], 32) for w in writes],
            "values": [_blob("value", w[3], MAX_WRITE_BYTES) for w in writes],
        }, conn)

    async def get_graph_checkpoint(
        self, tenant: str, thread: str, ns: str, checkpoint_id: str | None = None, *,
        conn: Conn | None = None,
    ) -> StoredCheckpoint | None:
        """The named checkpoint of the tenant's thread, or its newest; None if none."""
        rows = await self._rows("graph_checkpoint_get", {
            "tenant": tenant, "thread": thread, "ns": ns, "checkpoint_id": checkpoint_id,
        }, conn)
        return _checkpoint(rows[0], ns) if rows else None

    async def get_graph_writes(
        self, tenant: str, thread: str, ns: str, checkpoint_id: str, *,
        conn: Conn | None = None,
    ) -> list[StoredWrite]:
        rows = await self._rows("graph_writes_get", {
            "tenant": tenant, "thread": thread, "ns": ns, "checkpoint_id": checkpoint_id,
            "limit": MAX_WRITES,
        }, conn)
        return [StoredWrite(r["task_id"], r["channel"], r["type"], bytes(r["value"]))
                for r in rows]

    async def list_graph_checkpoints(
        self, tenant: str, thread: str, *, ns: str | None = None,
        checkpoint_id: str | None = None, before: str | None = None,
        filter_: Mapping[str, Any] | None = None, limit: int = 100, conn: Conn | None = None,
    ) -> list[StoredCheckpoint]:
        """The thread's checkpoints, newest first (at most MAX_LIST)."""
        if not 1 <= limit <= MAX_LIST:
            raise ValidationError("limit", f"must be between 1 and {MAX_LIST}")
        rows = await self._rows("graph_checkpoint_list", {
            "tenant": tenant, "thread": thread, "ns": ns, "checkpoint_id": checkpoint_id,
            "before": before, "limit": limit,
            "filter": None if not filter_ else json.dumps(dict(filter_), default=str),
        }, conn)
        return [_checkpoint(r, r["checkpoint_ns"]) for r in rows]


def _checkpoint(row: Mapping[str, Any], ns: str) -> StoredCheckpoint:
    return StoredCheckpoint(ns, row["checkpoint_id"], row["parent_id"], row["type"],
                            bytes(row["checkpoint"]), row["metadata"], row["run_id"])
