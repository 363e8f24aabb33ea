"""LangGraph graphs as runlease runs (issue 30): runlease.integrations.langgraph
against real PostgreSQL, real langgraph, in-process and real `runlease
worker` processes (tests/support/langgraph_graphs.py holds the graphs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from runlease.db.store import RunStore
from runlease.integrations import langgraph as adapter
from tests.integration.test_worker import finished
from tests.support import langgraph_graphs as graphs
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCall
from tests.support.workers import running_worker


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def kinds(store: RunStore, run_id: UUID) -> list[str]:
    return [e.kind for e in await store.events_after(run_id)]


async def test_a_two_node_graph_runs_to_its_result(live_store: RunStore, db_url: str,
                                                    tmp_path: Path) -> None:
    log = tmp_path / "log"
    queued = await live_store.enqueue("default", "acme", {"input": {"log": str(log)}})
    async with running_worker(db_url, adapter.adapt(graphs.two_nodes)):
        run = await finished(live_store, queued.run.id)
    assert (run.status, run.attempts) == ("done", 1), run.error_message
    assert lines(log) == ["first", "second-started", "second"]
    assert run.result_json is not None
    assert run.result_json["values"]["done"] == ["first", "second"]
    assert run.result_json["thread_id"] == str(run.id)
