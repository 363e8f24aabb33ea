"""The console's time and money, without I/O: durations as people read them,
a run's summary from its input (bounded, whatever the input), the timeline's
bars for a run in a state this console does not know (issue 28's
`waiting`), and the runs table rendering such a status."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from runlease.api.console.attempts import Attempt
from runlease.api.console.filters import Filters
from runlease.api.console.render import make_env
from runlease.api.console.summary import summary
from runlease.api.console.timeline import duration, timeline
from runlease.core.states import RunStatus
from runlease.db.console import StatusCounts, TimelineRows
from runlease.db.models import Run

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def a_run(status: Any = RunStatus.PENDING, **fields: Any) -> Run:
    values: dict[str, Any] = {
        "id": UUID("01900000-0000-7000-8000-000000000001"), "pool": "default",
        "tenant_id": "acme", "status": status, "priority": 0, "attempts": 1,
        "max_attempts": 3, "lease_epoch": 1, "available_at": T0, "input_json": {},
        "budget_json": {}, "created_at": T0, "updated_at": T0} | fields
    return Run(**values)


def test_durations_read_as_people_read_them() -> None:
    assert [duration(s) for s in (0, 0.4242, 9.999, 12.34, 65, 3599, 3600, 7380, 93600)] == [
        "0.00 s", "0.42 s", "10.00 s", "12.3 s", "1 min 05 s", "59 min 59 s", "1 h 00 min",
        "2 h 03 min", "1 d 2 h"]
    assert duration(None) == "\u2014"


def test_a_summary_is_the_title_else_the_first_words_of_the_input() -> None:
    assert summary(a_run(title="Nightly eval", input_json={"prompt": "x"})) == (
        "Nightly eval", True)
    assert summary(a_run(input_json={"steps": [{"emit": {"text": "hello there"}}],
                                     "task": "Fix  the\nflaky   test"})) == (
        "Fix the flaky test", False)
    assert summary(a_run(input_json={"n": 1, "deep": [[[{"x": "found me"}]]]})) == (
        "found me", False)
    assert summary(a_run(input_json={})) == ("", False)
    long = summary(a_run(input_json={"prompt": "word " * 500}))[0]
    assert long.endswith("\u2026")
    assert len(long) <= 80
    one_word = summary(a_run(input_json={"prompt": "z" * 5000}))[0]
    assert len(one_word) == 80
    # A huge input is looked at for a bounded number of values, not all of it.
    huge = {"items": [{"n": i} for i in range(200_000)] + ["too far to be found"]}
    assert summary(a_run(input_json=huge)) == ("", False)


def test_a_run_in_a_status_this_console_does_not_know_is_drawn_until_now() -> None:
    claimed, parked, now = T0 + timedelta(seconds=2), T0 + timedelta(seconds=5), \
        T0 + timedelta(seconds=10)
    run = a_run("waiting")
    tries = [Attempt(1, "w", claimed, parked, "waiting for its children")]
    drawn = timeline(run, tries, TimelineRows(now, [], []))
    assert [(b.kind, b.label, b.left, b.width, b.running) for b in drawn.bars] == [
        ("queued", "queued", 0.0, 20.0, False), ("attempt", "attempt 1", 20.0, 30.0, False),
        ("queued", "waiting", 50.0, 50.0, True)]


@dataclass(frozen=True)
class Viewer:
    admin: bool = False
    scope: str | None = "acme"
    name: str = "acme"
    csrf: str = "x"


def test_the_runs_table_shows_a_status_it_does_not_know() -> None:
    page = make_env().get_template("_runs_table.html").render(
        viewer=Viewer(), f=Filters(), runs=[a_run("waiting", title="Asks a person")],
        counts=StatusCounts({"pending": 1}), statuses=("pending", "waiting"), now=T0,
        live=True, next_query=None)
    assert 'data-status="waiting"' in page
    assert '<span class="badge waiting">waiting</span>' in page
    assert 'href="/ui/runs?status=waiting"' in page  # its count links to its filter
    assert "Asks a person" in page


def test_a_run_cancelled_before_any_claim_shows_its_wait() -> None:
    run = a_run(RunStatus.CANCELLED, attempts=0, finished_at=T0 + timedelta(seconds=8))
    drawn = timeline(run, [], TimelineRows(T0 + timedelta(seconds=30), [], []))
    assert [(b.label, b.left, b.width, b.detail) for b in drawn.bars] == [
        ("queued, never claimed", 0.0, 100.0, "cancelled")]
    assert drawn.seconds == 8
