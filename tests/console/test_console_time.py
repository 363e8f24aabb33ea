"""The console's time and money (issue 29) over HTTP, against a real API and
PostgreSQL: each run's summary (title, else the first words of its input)
and duration in the runs list, escaped; several statuses at once and an id
prefix, never a 500 whatever is searched; a run's durations, usage against
its budget and its timeline, positioned from the stored times; the usage
page, a tenant's own only; a pool with ready runs and no live worker."""

from __future__ import annotations

import html
import re
from datetime import datetime
from urllib.parse import quote

import psycopg

from runlease.clock import ManualClock
from runlease.db.models import Pool
from runlease.db.store import Registration, RunStore
from tests.console.test_console_http import signed_in
from tests.support.api import Api

WORKER = "pod-t:boot-t:7"
HOSTILE_TITLE = "<script>alert('pwned')</script><img src=x onerror=alert(1)>"


def runs_in(page: str) -> list[str]:
    return re.findall(r'<tr data-run="([0-9a-f-]{36})"', page)


def summaries(page: str) -> dict[str, str]:
    return {m[0]: html.unescape(m[1]) for m in re.findall(
        r'<tr data-run="([0-9a-f-]{36})"[^>]*>\s*<td><a href="[^"]+" class="run-summary'
        r'[^"]*"[^>]*>(.*?)</a>', page, re.S)}


async def test_the_runs_list_says_what_each_run_is_and_how_long_it_took(
        ui: Api, store: RunStore, clock: ManualClock) -> None:
    titled = (await store.enqueue("default", "acme", {"prompt": "ignored"},
                                  title="Nightly eval: search quality")).run
    derived = (await store.enqueue("default", "acme", {
        "steps": [{"sleep": 1}], "prompt": "Summarise the incident report of the night "
                                           "of 3 December for the on-call team, in five lines"
    })).run
    hostile = (await store.enqueue("default", "acme", {"x": 1}, title=HOSTILE_TITLE)).run
    empty = (await store.enqueue("default", "acme", {})).run
    (lease,) = await store.claim("default", WORKER, 1, lease_s=60)
    assert lease.run_id == titled.id
    clock.advance(45)
    await store.ack(lease, {"ok": True})
    async with signed_in(ui, "acme") as acme:
        page = (await acme.get("/ui/runs")).text
    said = summaries(page)
    assert said[str(titled.id)] == "Nightly eval: search quality"
    # No title: the first words of the input, telling keys first (prompt before steps).
    assert said[str(derived.id)] == ("Summarise the incident report of the night of 3 "
                                     "December for the\u2026")
    assert said[str(empty.id)] == "(empty input)"
    # A hostile title is text: escaped, no tag of it reaches the page.
    assert said[str(hostile.id)] == HOSTILE_TITLE
    assert "<script>alert" not in page
    assert "<img src=x" not in page
    # The finished run's duration: submit to finish, 45 s by the test's clock.
    row = page.split(f'data-run="{titled.id}"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="took">45.0 s</td>' in row
    pending_row = page.split(f'data-run="{derived.id}"', 1)[1].split("</tr>", 1)[0]
    assert 'class="took so-far"' in pending_row


async def test_several_statuses_at_once_and_an_id_prefix(ui: Api, store: RunStore) -> None:
    done = (await store.enqueue("default", "acme", {"n": 1})).run
    (lease,) = await store.claim("default", WORKER, 1)
    await store.ack(lease, None)
    cancelled = (await store.enqueue("default", "acme", {"n": 2})).run
    await store.request_cancel(cancelled.id)
    pending = (await store.enqueue("default", "acme", {"n": 3})).run
    theirs = (await store.enqueue("default", "globex", {"n": 4})).run
    async with signed_in(ui, "acme") as acme:
        both = await acme.get("/ui/runs?status=done&status=cancelled")
        assert both.status_code == 200
        assert set(runs_in(both.text)) == {str(done.id), str(cancelled.id)}
        # The fragment polled by htmx keeps both statuses in its own link.
        assert "status=done&amp;status=cancelled" in both.text
        fragment = await acme.get("/ui/runs/table?status=done&status=cancelled",
                                  headers={"HX-Request": "true"})
        assert set(runs_in(fragment.text)) == {str(done.id), str(cancelled.id)}
        # Every status this runlease knows is offered as a box to tick.
        for s in ("pending", "leased", "done", "dead", "cancelled"):
            assert f'name="status" value="{s}"' in both.text
        one = await acme.get("/ui/runs?status=pending")
        assert runs_in(one.text) == [str(pending.id)]
        unknown = await acme.get("/ui/runs?status=pending&status=bogus")
        assert unknown.status_code == 400
        assert "bogus" in unknown.text
        # An id prefix (any case, dashes or not), within the other filters.
        prefix = str(pending.id).replace("-", "")[:12]
        found = await acme.get(f"/ui/runs?q={prefix.upper()}")
        assert str(pending.id) in runs_in(found.text)
        narrowed = await acme.get(f"/ui/runs?q={prefix}&status=done")
        assert str(pending.id) not in runs_in(narrowed.text)
        # Another tenant's run is never found, by prefix or whole id.
        for q in (str(theirs.id), str(theirs.id)[:13]):
            assert str(theirs.id) not in runs_in((await acme.get(f"/ui/runs?q={q}")).text)
        odd = ["%", "%%", "_", "*", "'", "\"", "\\", "0000000-", "--------", "abc\u00e9",
               "\u202e", "a" * 255, "a" * 256, "x" * 10_000, "0123abcd" * 5, "1e3",
               "<script>", "' OR 1=1 --", "\x00", "\x01", "\ud7ff", "g" * 8, "-" * 35,
               "0123abcd-", "0123ABCD-EF", "ffffffff-ffff-ffff-ffff-ffffffffffff0"]
        for q in odd:
            r = await acme.get(f"/ui/runs?q={quote(q, safe='')}")
            assert r.status_code in (200, 400), (q, r.status_code)
            assert "<script>" not in r.text.split("<main", 1)[1] or q != "<script>"
        for bad in ("status=" + quote("\x00"), "status=" + "p" * 5000,
                    "&".join(["status=done"] * 500)):
            r = await acme.get(f"/ui/runs?{bad}")
            assert r.status_code in (200, 400), (bad, r.status_code)


async def test_a_run_page_shows_its_time_its_usage_against_its_budget_and_a_timeline(
        ui: Api, store: RunStore, clock: ManualClock, db_url: str) -> None:
    run = (await store.enqueue("default", "acme", {"task": "eval"},
                               budget={"max_tokens": 10_000, "max_cost": 2, "max_turns": 8},
                               title="Evaluate the search agent")).run
    clock.advance(4)  # queue wait: 4 s
    (first,) = await store.claim("default", WORKER, 1, lease_s=60)
    clock.advance(3)
    await store.record_step(first, "0", {"fetched": True})
    clock.advance(2)
    await store.record_usage(first, input_tokens=1500, output_tokens=500, cost=0.5, turns=2)
    await store.record_event(first, "tool.exit", {"step": 1, "returncode": 0,
                                                  "duration_s": 1.5})
    clock.advance(1)
    await store.nack(first, "model_unavailable", "the model was down", retry_after_s=5)
    clock.advance(6)
    (second,) = await store.claim("default", WORKER, 1, lease_s=60)
    clock.advance(2)
    await store.record_step(second, "1", {"answer": 42})
    clock.advance(2)
    await store.ack(second, {"answer": 42})

    async with signed_in(ui, "acme") as acme:
        page = (await acme.get(f"/ui/runs/{run.id}")).text
    assert 'id="run-title">Evaluate the search agent<' in page
    assert re.search(r'id="queue-wait">4\.00 s', page)
    assert re.search(r'id="run-duration">20\.0 s', page)
    budget = dict(re.findall(r'<tr data-budget="([^"]+)"><td>[^<]+</td><td class="used">'
                             r'([^<]+)</td>', page))
    assert budget["Tokens"] == "2,000 (1,500 in, 500 out)"
    assert budget["Cost"] == "0.5000"
    assert budget["Model turns"] == "2"
    assert '<meter min="0" max="10000.0" value="2000.0"' in page
    assert "20.0 %" in page  # 2,000 tokens of 10,000

    # The bars, in order, positioned from what the database stored.
    bars = re.findall(r'<li class="tl-row (\w+)[^"]*" data-kind="\w+" data-start="([^"]+)" '
                      r'data-end="([^"]+)">.*?<rect class="tl-bar" x="([\d.]+)%" y="2" '
                      r'width="([\d.]+)%"', page, re.S)
    assert [b[0] for b in bars] == ["queued", "attempt", "step", "tool", "queued", "attempt",
                                    "step"]
    with psycopg.connect(db_url) as conn:
        created, finished = conn.execute("SELECT created_at, finished_at FROM agent_runs "
                                         "WHERE id = %s", (run.id,)).fetchone()
        steps = conn.execute("SELECT step_key, created_at FROM agent_run_steps "
                             "WHERE run_id = %s ORDER BY created_at", (run.id,)).fetchall()
        holders = conn.execute("SELECT h->>'at' FROM agent_runs, jsonb_array_elements(holders) h"
                               " WHERE id = %s", (run.id,)).fetchall()
    total = (finished - created).total_seconds()
    assert total == 20
    claims = [datetime.fromisoformat(h[0]) for h in holders]
    lefts = [float(b[3]) for b in bars]
    widths = [float(b[4]) for b in bars]

    def pct(seconds: float) -> float:
        return 100 * seconds / total

    want = [  # (left, width) in percent: queue 4 s, attempt 6 s, step 3 s, tool 1.5 s...
        (0, pct(4)), (pct(4), pct(6)), (pct(4), pct(3)), (pct(7.5), pct(1.5)),
        (pct(10), pct(6)), (pct(16), pct(4)), (pct(16), pct(2))]
    for (kind, *_), left, width, (w_left, w_width) in zip(bars, lefts, widths, want,
                                                          strict=True):
        assert abs(left - w_left) < 0.01, (kind, left, width)
        assert abs(width - w_width) < 0.01, (kind, left, width)
    # The bars' own times are the stored ones.
    assert datetime.fromisoformat(bars[2][2]) == steps[0][1]
    assert datetime.fromisoformat(bars[6][2]) == steps[1][1]
    assert datetime.fromisoformat(bars[1][1]) == claims[0]


async def test_the_usage_page_shows_a_tenant_its_own_usage_only(
        ui: Api, store: RunStore) -> None:
    for tenant, pool, tokens in (("acme", "default", (1000, 200)), ("acme", "batch", (50, 5)),
                                 ("globex", "default", (7777, 3333))):
        if pool != "default":
            await store.upsert_pool(Pool(pool))
        await store.enqueue(pool, tenant, {"n": 1})
        await store.register_worker(Registration(f"{WORKER}-{pool}-{tenant}", pool, 1),
                                    lease_s=60)
        (lease,) = await store.claim(pool, f"{WORKER}-{pool}-{tenant}", 1)
        await store.record_usage(lease, input_tokens=tokens[0], output_tokens=tokens[1],
                                 cost=0.25)
    async with signed_in(ui, "acme") as acme:
        page = await acme.get("/ui/usage")
        assert page.status_code == 200
        rows = re.findall(r'<tr data-day="[^"]+" data-tenant="(\w+)" data-pool="([\w-]+)">',
                          page.text)
        assert sorted(rows) == [("acme", "batch"), ("acme", "default")]
        assert "7,777" not in page.text
        assert "globex" not in page.text.split("<main", 1)[1]
        assert "1,255" in page.text  # acme's tokens, both pools
        assert re.search(r'<rect class="bar" data-day="[^"]+" data-tokens="1255"', page.text)
        # Asking for another tenant changes nothing for a tenant.
        theirs = await acme.get("/ui/usage?tenant=globex")
        assert "7,777" not in theirs.text
        for bad in ("from=yesterday", "to=2026-13-01", "from=2026-12-02&to=2026-12-01",
                    "from=2020-01-01&to=2026-12-01", "pool=NOT_A_POOL", "from=0",
                    "to=0001-01-01", "from=9999-12-31&to=9999-12-31"):
            r = await acme.get(f"/ui/usage?{bad}")
            assert r.status_code in (200, 400), (bad, r.status_code)
        assert (await acme.get("/ui/usage?to=0001-01-03")).status_code == 200
    async with signed_in(ui, "admin") as admin:
        page = (await admin.get("/ui/usage")).text
        rows = re.findall(r'data-tenant="(\w+)" data-pool="([\w-]+)"', page)
        assert sorted(rows) == [("acme", "batch"), ("acme", "default"), ("globex", "default")]
        one = (await admin.get("/ui/usage?tenant=globex")).text
        assert re.findall(r'data-tenant="(\w+)"', one) == ["globex"]


async def test_the_pools_page_flags_ready_runs_with_no_live_worker(
        ui: Api, store: RunStore) -> None:
    await store.upsert_pool(Pool("lonely"))
    await store.enqueue("lonely", "acme", {"n": 1})
    await store.register_worker(Registration(WORKER, "default", 2), lease_s=60)
    await store.enqueue("default", "acme", {"n": 2})
    async with signed_in(ui, "admin") as admin:
        page = (await admin.get("/ui/pools")).text
        assert 'id="unserved-lonely"' in page
        assert 'id="unserved-default"' not in page  # a live worker serves default
        stats = (await admin.get("/ui/pools/lonely/stats")).text
        assert "No live worker serves this pool" in stats
