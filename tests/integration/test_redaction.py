"""Redaction of what runs store, against a real PostgreSQL: streamed deltas
are redacted on the assembled message (a secret split across deltas is never
stored in pieces), and every stored field passes the redactor."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runlease.core.redact import MASK, Redactor
from runlease.db.connect import make_conn_pool
from runlease.db.models import Lease
from runlease.db.store import RunStore
from runlease.worker import RunContext, deltas
from runlease.worker.tools import ToolRunner
from tests.integration.test_worker import finished, running_worker
from tests.support.databases import RegisteringStore
from tests.support.secrets import leaked, message, split
from tests.support.waiting import until

_tenants = itertools.count()


async def _lease(store: RunStore) -> Lease:
    # A tenant per run, so no tenant cap is reached however many examples run.
    queued = await store.enqueue("default", f"t{next(_tenants)}", {})
    leases = await store.claim("default", "test:boot:1")
    assert [lease.run_id for lease in leases] == [queued.run.id]
    return leases[0]


async def _stored_texts(store: RunStore, lease: Lease) -> list[str]:
    return [e.data["text"] for e in await store.events_after(lease.run_id)
            if e.kind == "message.delta"]


async def _stream(store: RunStore, deltas: list[str], pauses: list[int]) -> list[str]:
    """Feed deltas through a real RunContext on a claimed lease; after each,
    yield to the loop `pause` times so the timed flush runs between them."""
    lease = await _lease(store)
    cancel = asyncio.Event()
    ctx = RunContext(lease, store, cancel=cancel, tools=ToolRunner(cancel, 1.0))
    try:
        for delta, pause in zip(deltas, pauses, strict=False):
            await ctx.delta(delta)
            for _ in range(pause):
                await asyncio.sleep(0)
        await ctx.flush()
    finally:
        await ctx.close()
    return await _stored_texts(store, lease)


def test_a_secret_split_across_deltas_is_never_stored(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Flush on every chance: at once on the timer, and by size every 8 characters.
    monkeypatch.setattr(deltas, "DELTA_FLUSH_S", 0.0)
    monkeypatch.setattr(deltas, "DELTA_FLUSH_CHARS", 8)
    loop = asyncio.new_event_loop()
    conn_pool = make_conn_pool(db_url, max_size=2)
    loop.run_until_complete(conn_pool.open(wait=True))
    store = RegisteringStore(conn_pool)

    @settings(max_examples=60, deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def check(data: st.DataObject) -> None:
        text, bodies = data.draw(message())
        deltas = data.draw(split(text))
        pauses = data.draw(st.lists(st.integers(0, 6), min_size=len(deltas),
                                    max_size=len(deltas)))
        stored = loop.run_until_complete(_stream(store, deltas, pauses))
        assert not leaked("".join(stored), bodies), stored
        for piece in stored:
            assert not leaked(piece, bodies), piece
        # Nothing else was lost: the stored message is the redacted whole.
        assert "".join(stored) == store.redactor.text("".join(stored))

    try:
        check()
    finally:
        loop.run_until_complete(conn_pool.close())
        loop.close()


_gate: asyncio.Event | None = None


async def _streams_a_bearer_token(ctx: RunContext) -> dict[str, Any]:
    assert _gate is not None
    await ctx.delta("hello world ")
    await ctx.delta("Authorization: Bea")
    await _gate.wait()
    await ctx.delta("rer abcdef")
    await ctx.sleep(0.2)  # the timed flush runs, and finds the line not yet ended
    await ctx.delta("123456\nbye")
    return {"ok": True}


async def test_a_worker_streams_live_and_holds_back_only_the_secret(
    live_store: RunStore, db_url: str
) -> None:
    global _gate
    _gate = asyncio.Event()
    queued = await live_store.enqueue("default", "acme", {})
    async with running_worker(db_url, _streams_a_bearer_token):
        # The text before the secret is stored while the message goes on.
        async def first() -> list[str] | None:
            texts = [e.data["text"] for e in await live_store.events_after(queued.run.id)]
            return texts or None

        # (`world` waits with the header after it: a header must not start an event.)
        assert await until(first, what="the first delta event") == ["hello "]
        _gate.set()
        run = await finished(live_store, queued.run.id)
    assert run.status == "done"
    texts = [e.data["text"] for e in await live_store.events_after(queued.run.id)]
    assert "".join(texts) == f"hello world Authorization: {MASK}\nbye"
    assert not any("abcdef" in t or "123456" in t for t in texts)


async def test_every_stored_field_is_redacted(live_store: RunStore) -> None:
    lease = await _lease(live_store)
    step = await live_store.record_step(lease, "s", {
        "stdout": "Set-Cookie: sid=s3cr3t; Path=/", "headers": {"X-Api-Key": "k3y"}})
    assert step == {"stdout": f"Set-Cookie: {MASK}", "headers": {"X-Api-Key": MASK}}
    await live_store.record_event(lease, "tool.result", {"id_token": "eyJabc", "n": 1})
    await live_store.nack(lease, "boom", "connect postgres://u:12345678@db failed; "
                                         "github_token=gho_abc123")
    run = await live_store.get(lease.run_id)
    assert run.error_message == f"connect postgres://u:{MASK}@db failed; github_token={MASK}"
    events = await live_store.events_after(lease.run_id)
    assert [e.data for e in events if e.kind == "tool.result"] == [{"id_token": MASK, "n": 1}]


async def test_a_run_result_is_redacted(live_store: RunStore) -> None:
    lease = await _lease(live_store)
    result = {"answer": "use password=hunter2x", "token": "abc", "n": random.randint(1, 9)}
    assert await live_store.ack_many([(lease, result)]) == set()
    run = await live_store.get(lease.run_id)
    assert run.result_json == {"answer": f"use password={MASK}", "token": MASK,
                               "n": result["n"]}


async def test_a_worker_redacts_its_log_lines_with_its_own_patterns(db_url: str) -> None:
    from runlease import logs
    from tests.support.workers import running_worker

    try:
        async with running_worker(db_url, redact_patterns=("PLANT-[0-9]+",)):
            assert logs._redactor.text("error near PLANT-4711") == f"error near {MASK}"
    finally:
        logs.use_redactor(Redactor())
