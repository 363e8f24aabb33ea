"""Event streams by the hundred on one API process: one LISTEN session and one
batched reader for all of them (api/fanout.py), no query for an idle stream,
every event to every subscriber exactly once, in order, also across a lost
LISTEN session; and no way into another tenant's run through the fan-out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import httpx
import psycopg
from psycopg import conninfo

from runlease.api.fanout import READ_APP_NAME, Fanout
from runlease.client import RunEnded, SseParser, StreamEvent
from runlease.core.states import RunStatus
from runlease.db.channels import EVENTS_CHANNEL
from runlease.db.models import Lease
from runlease.db.queries import sql, statements
from runlease.db.store import RunStore
from tests.support.api import Api, serve_api
from tests.support.waiting import until

LISTEN_APP_NAME = "runlease-api-listen"


def fanout_of(api: Api) -> Fanout:
    hub = api.server.app_state.opened().hub
    assert hub is not None
    return hub.fanout


def subscribers(api: Api) -> int:
    return sum(f.subscribers for f in fanout_of(api).feeds.values())


@contextlib.asynccontextmanager
async def http_for(api: Api, who: str = "acme") -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers(who), timeout=60,
                                 limits=limits) as http:
        yield http


async def follow(http: httpx.AsyncClient, run_id: UUID, seen: list[int], *,
                 after: int = 0) -> str:
    """Read the run's stream into `seen` (seqs) until its end; its status."""
    parser = SseParser()
    headers = {"Last-Event-ID": str(after)} if after else {}
    async with http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as r:
        assert r.status_code == 200, r.status_code
        async for line in r.aiter_lines():
            item = parser.feed(line)
            if isinstance(item, StreamEvent):
                seen.append(item.seq)
            elif isinstance(item, RunEnded):
                return item.status
    return "dropped"


async def leased_runs(store: RunStore, n: int, tenant: str = "acme") -> list[Lease]:
    for i in range(n):
        await store.enqueue("default", tenant, {"i": i})
    leases = await store.claim("default", "w-fanout", n)
    assert len(leases) == n
    return leases


def feed_sessions(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE application_name = ANY(%s) AND datname = current_database() "
            "GROUP BY application_name", [[READ_APP_NAME, LISTEN_APP_NAME]]).fetchall()
    return {name: int(n) for name, n in rows}


def terminate(db_url: str, application_name: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            [application_name]).fetchall()
    return len(rows)


async def test_five_hundred_idle_streams_hold_two_connections_and_make_no_query(
    db_url: str, live_store: RunStore
) -> None:
    async with serve_api(db_url, sse_max_streams_per_tenant=1000) as api, \
            http_for(api) as http:
        leases = await leased_runs(live_store, 250)
        seen: dict[UUID, list[list[int]]] = {lease.run_id: [[], []] for lease in leases}
        tasks = [asyncio.create_task(follow(http, run_id, got))
                 for run_id, pair in seen.items() for got in pair]
        try:
            async def all_following() -> bool:
                return subscribers(api) == 500
            await until(all_following, timeout_s=120, what="500 streams following")
            fanout = fanout_of(api)
            assert fanout.listening

            async def settled() -> bool:
                return fanout.settled
            await until(settled, what="the first reads of the new feeds")
            sessions = feed_sessions(db_url)
            assert sessions.get(LISTEN_APP_NAME) == 1
            assert sum(sessions.values()) <= 5, sessions
            # Quiet: longer than the fallback poll (0.2 s) and the keepalive
            # (1 s), so polling or per-stream reads would show.
            reads = fanout.reads
            await asyncio.sleep(2.5)
            assert fanout.reads == reads, "idle streams made queries"
            assert subscribers(api) == 500

            # The API still answers while they are open.
            for i in range(10):
                submitted = await http.post("/v1/runs", json={"input": {"extra": i}})
                assert submitted.status_code == 201, submitted.text
            got = await http.get(f"/v1/runs/{leases[0].run_id}")
            assert got.status_code == 200
            assert got.json()["status"] == "leased"

            # One event wakes its run's two subscribers, through one read.
            await live_store.record_event(leases[7], "tick", {"n": 1})

            async def delivered() -> bool:
                return all(got == [1] for got in seen[leases[7].run_id])
            await until(delivered, what="the event on both streams of its run")
            assert fanout.reads - reads <= 2
            assert all(got == [] for run_id, pair in seen.items()
                       if run_id != leases[7].run_id for got in pair)
            assert sum(feed_sessions(db_url).values()) <= 5
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_many_subscribers_of_one_run_each_get_every_event_once_in_order(
    db_url: str, live_store: RunStore
) -> None:
    async with serve_api(db_url) as api, http_for(api) as http:
        (lease,) = await leased_runs(live_store, 1)
        early: list[list[int]] = [[] for _ in range(40)]
        tasks = [asyncio.create_task(follow(http, lease.run_id, got)) for got in early]

        async def all_following() -> bool:
            return subscribers(api) == 40
        await until(all_following, what="40 streams following")
        writes = 0
        late: list[list[int]] = [[] for _ in range(20)]
        for i in range(60):
            # Batches of 1 to 4 events; late subscribers join partway, some
            # resuming after a seq they had.
            await live_store.record_events(lease, [("tick", {"i": i, "j": j})
                                                   for j in range(1 + i % 4)])
            writes += 1
            if i % 3 == 0 and i // 3 < len(late):
                got = late[i // 3]
                tasks.append(asyncio.create_task(follow(http, lease.run_id, got)))
        await live_store.ack(lease)
        ends = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    total = sum(1 + i % 4 for i in range(60))
    assert set(ends) == {"done"}
    for got in early + late:
        assert got == list(range(1, total + 1))
    # Shared: the reads follow the writes, not the subscribers (60 of them).
    assert fanout_of(api).reads <= 2 * writes + 30


async def test_events_of_many_runs_written_at_once_all_arrive(
    db_url: str, live_store: RunStore
) -> None:
    async with serve_api(db_url, sse_max_streams_per_tenant=1000) as api, \
            http_for(api) as http:
        leases = await leased_runs(live_store, 100)
        seen = {lease.run_id: [] for lease in leases}
        tasks = [asyncio.create_task(follow(http, run_id, got)) for run_id, got in seen.items()]

        async def all_following() -> bool:
            return subscribers(api) == 100
        await until(all_following, what="100 streams following")

        async def write(lease: Lease) -> None:
            for i in range(10):
                await live_store.record_event(lease, "tick", {"i": i})
            await live_store.ack(lease)

        await asyncio.gather(*(write(lease) for lease in leases))
        ends = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert set(ends) == {"done"}
    for got in seen.values():
        assert got == list(range(1, 11))


class Gate:
    """A TCP relay to PostgreSQL that can refuse new connections (the
    established ones stay): a LISTEN session killed behind it cannot come
    back until the gate opens."""

    def __init__(self, db_url: str) -> None:
        params = conninfo.conninfo_to_dict(db_url)
        self.target = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self.params = params
        self.open = True
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return conninfo.make_conninfo(**{**self.params, "host": "127.0.0.1",  # type: ignore[arg-type]
                                         "port": str(port)})

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while chunk := await src.read(65536):
                    dst.write(chunk)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_a_killed_listen_session_falls_back_to_polling_then_recovers_losing_nothing(
    db_url: str, live_store: RunStore
) -> None:
    gate = Gate(db_url)
    listen_url = await gate.start()
    try:
        async with serve_api(db_url, listen_database_url=listen_url) as api, \
                http_for(api) as http:
            leases = await leased_runs(live_store, 5)
            seen: dict[UUID, list[list[int]]] = {lease.run_id: [[], []] for lease in leases}
            tasks = [asyncio.create_task(follow(http, run_id, got))
                     for run_id, pair in seen.items() for got in pair]
            fanout = fanout_of(api)

            async def all_following() -> bool:
                return subscribers(api) == 10 and fanout.listening
            await until(all_following, what="10 streams following, listening")

            async def write_all(n: int) -> None:
                for lease in leases:
                    await live_store.record_events(lease, [("tick", {}) for _ in range(n)])

            def all_have(n: int) -> Any:
                async def probe() -> bool:
                    return all(len(got) >= n for pair in seen.values() for got in pair)
                return probe

            await write_all(2)
            await until(all_have(2), what="events before the kill")

            gate.open = False
            assert terminate(db_url, LISTEN_APP_NAME) == 1

            async def lost() -> bool:
                return not fanout.listening
            await until(lost, what="the LISTEN session seen lost")
            await write_all(3)  # only the fallback poll can deliver these
            await until(all_have(5), what="events through the fallback poll")
            assert not fanout.listening

            gate.open = True

            async def back() -> bool:
                return fanout.listening
            await until(back, what="the LISTEN session back")
            await write_all(2)
            # The reader's own connection killed too: it reconnects by itself.
            assert terminate(db_url, READ_APP_NAME) == 1
            await write_all(1)
            for lease in leases:
                await live_store.ack(lease)
            ends = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            reads = fanout.reads
            assert fanout.listening
    finally:
        await gate.close()
    assert set(ends) == {"done"}
    for pair in seen.values():
        for got in pair:
            assert got == list(range(1, 9))
    assert reads > 0


async def test_another_tenant_cannot_follow_a_run_through_the_fanout(
    db_url: str, live_store: RunStore
) -> None:
    async with serve_api(db_url) as api, http_for(api, "acme") as acme, \
            http_for(api, "globex") as globex:
        (theirs,) = await leased_runs(live_store, 1, tenant="acme")
        own_run = (await live_store.enqueue("default", "globex", {})).run
        acme_seen: list[int] = []
        globex_seen: list[int] = []
        tasks = [asyncio.create_task(follow(acme, theirs.run_id, acme_seen)),
                 asyncio.create_task(follow(globex, own_run.id, globex_seen))]

        async def following() -> bool:
            return subscribers(api) == 2
        await until(following, what="both streams following")
        # The run has a live feed; another tenant still gets the 404 of a run
        # that does not exist, with or without a Last-Event-ID.
        for headers in ({}, {"Last-Event-ID": "0"}):
            refused = await globex.get(f"/v1/runs/{theirs.run_id}/events", headers=headers)
            assert refused.status_code == 404
            assert refused.json()["error"]["code"] == "not_found"
        await live_store.record_event(theirs, "secret", {"x": 1})

        async def delivered() -> bool:
            return acme_seen == [1]
        await until(delivered, what="the owner's event")
        await live_store.ack(theirs)
        assert await asyncio.wait_for(tasks[0], 30) == "done"
        assert globex_seen == []
        assert subscribers(api) == 1
        tasks[1].cancel()
        await asyncio.gather(tasks[1], return_exceptions=True)


def events_rows_read(plan: dict[str, Any]) -> tuple[int, list[str]]:
    """Rows the plan read from agent_run_events, and how it read them."""
    rows, how = 0, []
    if plan.get("Relation Name") == "agent_run_events":
        how.append(plan["Node Type"])
        rows += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * \
            plan.get("Actual Loops", 1)
    for child in plan.get("Plans", []):
        more, kinds = events_rows_read(child)
        rows, how = rows + more, how + kinds
    return rows, how


async def test_one_fanout_read_gives_each_run_its_new_events_and_status_by_index(
    db_url: str, live_store: RunStore
) -> None:
    leases = await leased_runs(live_store, 50)
    with psycopg.connect(db_url, autocommit=True) as conn:
        # 200 events for each of the 50 runs: 10,000 rows a scan would read.
        conn.execute(
            "INSERT INTO agent_run_events (run_id, seq, kind)"
            " SELECT r, g, 'tick' FROM unnest(%s::uuid[]) r, generate_series(1, 200) g",
            [[lease.run_id for lease in leases]])
        conn.execute("UPDATE agent_runs SET event_seq = 200")
        conn.execute("VACUUM ANALYZE agent_run_events")
    done, fresh, quiet, *_ = leases
    await live_store.ack(done)
    missing = uuid4()
    news, limit = await live_store.events_fanout(
        {done.run_id: 195, fresh.run_id: 0, quiet.run_id: 200, missing: 0})
    assert limit == 500
    assert set(news) == {done.run_id, fresh.run_id, quiet.run_id}  # missing: gone
    assert [e.seq for e in news[done.run_id].events] == [196, 197, 198, 199, 200]
    assert news[done.run_id].finished
    assert [e.seq for e in news[fresh.run_id].events] == list(range(1, 201))
    assert news[quiet.run_id].events == []
    assert news[quiet.run_id].status is RunStatus.LEASED
    assert not news[quiet.run_id].finished
    ended = await live_store.runs_ended([done.run_id, missing])
    assert list(ended) == [done.run_id]
    assert ended[done.run_id].status is RunStatus.DONE

    # Many runs, each after its last seq: the primary key, a few rows each.
    after = {lease.run_id: 198 for lease in leases[3:]}
    with psycopg.connect(db_url, autocommit=True) as conn:
        (plan,) = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + sql("run_events_fanout"),
            {"ids": list(after), "afters": list(after.values()), "limit": 100}).fetchone()
    if isinstance(plan, str):
        plan = json.loads(plan)
    rows, how = events_rows_read(plan[0]["Plan"])
    assert how, plan
    assert "Seq Scan" not in how, how
    assert rows <= 2 * len(after) + 10, (rows, how)


def test_every_transition_that_writes_an_event_or_ends_a_run_notifies_the_streams(
    db_url: str,
) -> None:
    # The fan-out reads a run only when notified: a transition that wrote an
    # event or ended the run without a NOTIFY would leave its streams waiting.
    # The channel is written out in runlease_notify_events (statements run by
    # hand need no parameter for it): it must be the one the API listens on.
    writers = [name for name, text in statements().items()
               if "INSERT INTO agent_run_events" in text and name != "run_event_record"]
    assert {"run_nack", "run_reap", "run_bulk_cancel", "run_children_wake"} <= set(writers)
    assert "pg_notify(%(channel)s, upd.id::text || ':' || upd.event_seq)" in \
        sql("run_event_record")  # the worker's own events, by the channel it is given
    for name in ["run_ack", *writers]:  # an ack ends the run without an event row
        assert "runlease_notify_events(array_agg(upd.id), array_agg(upd.event_seq))" in \
            sql(name), name
        assert "CROSS JOIN events_notify" in sql(name), name
    with psycopg.connect(db_url, autocommit=True) as conn:
        (body,) = conn.execute("SELECT prosrc FROM pg_proc"
                               " WHERE proname = 'runlease_notify_events'").fetchone()
    assert f"pg_notify('{EVENTS_CHANNEL}', e.id::text || ':' || e.seq)" in body


async def test_subscribers_leaving_mid_wait_never_stall_the_reader_for_the_others(
    db_url: str, live_store: RunStore
) -> None:
    # Clients that go away while their streams wait leave nothing behind that
    # the run's other subscriber or the one reader of every stream depends on.
    async with serve_api(db_url) as api, http_for(api) as http:
        busy, other = await leased_runs(live_store, 2)
        kept: list[int] = []
        others: list[int] = []
        tasks = [asyncio.create_task(follow(http, busy.run_id, kept)),
                 asyncio.create_task(follow(http, other.run_id, others))]
        for _ in range(3):
            leaving = []
            for _ in range(40):
                reader, writer = await asyncio.open_connection("127.0.0.1", api.server.port)
                writer.write(f"GET /v1/runs/{busy.run_id}/events HTTP/1.1\r\nHost: t\r\n"
                             f"Authorization: Bearer {api.token('acme')}\r\n\r\n".encode())
                leaving.append((reader, writer))

            async def joined() -> bool:
                return subscribers(api) == 42
            await until(joined, what="40 more streams following")
            for _, writer in leaving:
                writer.close()

            async def left() -> bool:
                return subscribers(api) == 2
            await until(left, what="the 40 streams gone")
        await live_store.record_event(busy, "tick", {})
        await live_store.record_event(other, "tick", {})
        await live_store.ack(busy)
        await live_store.ack(other)
        ends = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert ends == ["done", "done"]
    assert (kept, others) == ([1], [1])


class Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(self.format(record))


async def test_streams_cut_at_shutdown_end_without_an_error(
    db_url: str, live_store: RunStore
) -> None:
    # Clients leaving while the server stops: each waiting stream is
    # cancelled more than once (the client's leaving, then shutdown). A
    # subscriber waiting on a Condition came out of it without its lock
    # ("Lock is not acquired", logged as an error of the ASGI app) and could
    # leave the lock held for the reader; an Event has no lock to leave.
    (lease,) = await leased_runs(live_store, 1)
    errors = Errors()
    logging.getLogger("uvicorn.error").addHandler(errors)  # where the ASGI app's errors go
    try:
        await _cut_at_shutdown(db_url, lease)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
    assert not [e for e in errors.seen if "Lock is not acquired" in e], errors.seen[:1]
    assert errors.seen == []


async def _cut_at_shutdown(db_url: str, lease: Lease) -> None:
    async with serve_api(db_url) as api:
        leaving = []
        for _ in range(200):
            _, writer = await asyncio.open_connection("127.0.0.1", api.server.port)
            writer.write(f"GET /v1/runs/{lease.run_id}/events HTTP/1.1\r\nHost: t\r\n"
                         f"Authorization: Bearer {api.token('acme')}\r\n\r\n".encode())
            leaving.append(writer)

        async def joined() -> bool:
            return subscribers(api) == 200
        await until(joined, what="200 streams following")
        for writer in leaving:
            writer.close()
