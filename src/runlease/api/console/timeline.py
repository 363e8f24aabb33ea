"""A run's time, drawn to scale: its queue waits, attempts, durable steps
and tool calls as bars on one axis, from its submit to its end (or the
database's now, while it runs).

What the database stores, and so what each bar is:

    queued    submit (or the previous attempt's end) to the claim
    attempt   the claim (holders) to how the lease ended (attempts.py), or now
    step      a durable step ends when it committed; it began when what came
              before it in its attempt ended (the claim, or the previous
              step's commit): no start is stored, so a bar covers the agent's
              own work between two steps too
    tool      a shell step's `tool.exit` (its end, and the tool's duration_s);
              a model's tool call from `tool.call` to `tool.result` (same id)

Bars are positioned in percent of the axis; the page draws them as SVG
rectangles (no inline style: the console's CSP forbids it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from runlease.api.console.attempts import Attempt
from runlease.db.console import TimelineRows
from runlease.db.models import Run

MAX_BARS = 300
MIN_WIDTH = 0.3  # percent of the axis: an instant stays visible
TICKS = 4


def seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def duration(value: float | None) -> str:
    """A duration as people read it: 0.42 s, 12.3 s, 4 min 05 s, 2 h 03 min, 3 d 4 h."""
    if value is None:
        return "\u2014"
    if value < 10:
        return f"{value:.2f} s"
    if value < 60:
        return f"{value:.1f} s"
    whole = int(value)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


@dataclass(frozen=True, slots=True)
class Bar:
    kind: str  # queued, attempt, step, tool
    label: str
    start: datetime
    end: datetime
    left: float  # percent of the axis
    width: float
    detail: str = ""
    running: bool = False  # still going: it ends at now

    @property
    def seconds(self) -> float:
        return seconds(self.start, self.end)


@dataclass(frozen=True, slots=True)
class Timeline:
    start: datetime
    end: datetime
    bars: list[Bar]
    ticks: list[tuple[float, str]]
    more: bool  # bars left out (MAX_BARS)

    @property
    def seconds(self) -> float:
        return seconds(self.start, self.end)


@dataclass(frozen=True, slots=True)
class _Span:
    kind: str
    label: str
    start: datetime
    end: datetime
    detail: str = ""
    running: bool = False


def _attempt_spans(run: Run, attempts: list[Attempt], now: datetime,
                   end: datetime) -> list[_Span]:
    spans: list[_Span] = []
    previous: datetime | None = run.created_at
    for i, a in enumerate(attempts):
        if a.started is None:
            previous = None
            continue
        if previous is not None and a.started > previous:
            what = "queued" if i == 0 else "waiting to retry"
            spans.append(_Span("queued", what, previous, a.started))
        running = a.outcome == "running"
        if a.ended is not None:
            stop = a.ended
        elif running:
            stop = now
        else:  # how it ended is older than the events read: until the next claim
            nxt = attempts[i + 1].started if i + 1 < len(attempts) else None
            stop = nxt or end
        label = f"attempt {a.attempt}" if a.attempt is not None else "attempt"
        detail = a.outcome + (f" ({a.error_code})" if a.error_code else "")
        spans.append(_Span("attempt", label, a.started, max(stop, a.started), detail, running))
        previous = a.ended if not running else None
    status = getattr(run.status, "value", str(run.status))
    if run.finished_at is not None and not attempts:  # ended before any worker claimed it
        label = "queued, never claimed" if not run.attempts else "no attempt recorded"
        spans.append(_Span("queued", label, run.created_at,
                           max(run.finished_at, run.created_at), status))
    if run.finished_at is None and status != "leased":
        # Pending again, or in a state of its own (`waiting` for a person's
        # input, issue 28; any status this console does not know): until now.
        since = previous if attempts else run.created_at
        label = ("waiting to retry" if attempts else "queued") if status == "pending" \
            else status
        if since is not None:
            spans.append(_Span("queued", label, since, max(now, since), running=True))
    return spans


def _inside(at: datetime, spans: list[_Span]) -> _Span | None:
    for s in spans:
        if s.kind == "attempt" and s.start <= at <= s.end:
            return s
    return None


def _step_spans(rows: TimelineRows, attempts: list[_Span]) -> list[_Span]:
    spans = []
    last: dict[datetime, datetime] = {}  # attempt start -> its latest step commit
    for key, _attempt, at in rows.steps:
        home = _inside(at, attempts)
        if home is None:  # committed by an attempt older than the history shown
            continue
        start = max(home.start, last.get(home.start, home.start))
        last[home.start] = at
        spans.append(_Span("step", f"step {key}", start, at, home.label))
    return spans


def _tool_spans(rows: TimelineRows, attempts: list[_Span], now: datetime,
                running: bool) -> list[_Span]:
    spans = []
    calls: dict[str, tuple[str, datetime]] = {}
    for kind, _seq, data, at in rows.tools:
        if kind == "tool.exit":
            took = data.get("duration_s")
            took = float(took) if isinstance(took, int | float) and took >= 0 else 0.0
            step = data.get("step")
            label = "tool" + (f" \u00b7 step {step}" if step is not None else "")
            rc = data.get("returncode")
            spans.append(_Span("tool", label, at - timedelta(seconds=took), at,
                               f"exit {rc}" if rc is not None else ""))
        elif kind == "tool.call" and isinstance(data.get("id"), str):
            calls[data["id"]] = (str(data.get("name") or "tool"), at)
        elif kind == "tool.result" and isinstance(data.get("id"), str):
            found = calls.pop(data["id"], None)
            if found is not None:
                spans.append(_Span("tool", f"tool {found[0]}", found[1], at))
    for name, at in calls.values():  # called, no result yet
        home = _inside(at, attempts)
        if running and home is not None and home.running:
            spans.append(_Span("tool", f"tool {name}", at, now, "running", running=True))
    return spans


def _ticks(span_s: float) -> list[tuple[float, str]]:
    return [(100.0 * i / TICKS, duration(span_s * i / TICKS)) for i in range(TICKS + 1)]


def timeline(run: Run, attempts: list[Attempt], rows: TimelineRows) -> Timeline:
    """The run's bars, each attempt followed by its steps and tool calls."""
    now = rows.now
    end = run.finished_at or now
    start = run.created_at
    end = max(end, start)
    spans = _attempt_spans(run, attempts, now, end)
    tries = [s for s in spans if s.kind == "attempt"]
    inner = _step_spans(rows, tries) + _tool_spans(rows, tries, now,
                                                   run.finished_at is None)
    ordered: list[_Span] = []
    placed: set[int] = set()
    for s in spans:
        ordered.append(s)
        if s.kind == "attempt":
            mine = [i for i, x in enumerate(inner)
                    if i not in placed and s.start <= x.end <= s.end]
            placed.update(mine)
            ordered.extend(sorted((inner[i] for i in mine), key=_order))
    ordered.extend(sorted((x for i, x in enumerate(inner) if i not in placed), key=_order))
    total = seconds(start, end)
    bars = [_bar(s, start, total) for s in ordered[:MAX_BARS]]
    return Timeline(start, end, bars, _ticks(total), len(ordered) > MAX_BARS)


def _order(s: _Span) -> tuple[datetime, datetime, int]:
    return (s.start, s.end, 0 if s.kind == "step" else 1)


def _bar(s: _Span, t0: datetime, total: float) -> Bar:
    clamp_start = max(s.start, t0)
    if total <= 0:
        left, width = 0.0, 100.0
    else:
        left = min(100.0, 100.0 * seconds(t0, clamp_start) / total)
        width = 100.0 * seconds(clamp_start, s.end) / total
    width = min(max(width, MIN_WIDTH), 100.0)
    left = min(left, 100.0 - width)
    return Bar(s.kind, s.label, clamp_start, max(s.end, clamp_start), round(left, 3),
               round(width, 3), s.detail, s.running)


def budget_rows(run: Run, now: datetime) -> list[dict[str, Any]]:
    """Used against limit, for every budget field the run has and its
    usage: tokens, cost, turns, tool calls, and the deadline (since submit)."""
    budget = run.budget_json if isinstance(run.budget_json, dict) else {}
    elapsed = seconds(run.created_at, run.finished_at or now)
    rows = [
        ("Tokens", run.input_tokens + run.output_tokens, budget.get("max_tokens"),
         f"{run.input_tokens + run.output_tokens:,} ({run.input_tokens:,} in, "
         f"{run.output_tokens:,} out)"),
        ("Cost", float(run.cost), budget.get("max_cost"), f"{float(run.cost):.4f}"),
        ("Model turns", run.turns_used, budget.get("max_turns"), f"{run.turns_used:,}"),
        ("Tool calls", run.tool_calls_used, budget.get("max_tool_calls"),
         f"{run.tool_calls_used:,}"),
    ]
    out = []
    for name, used, limit, text in rows:
        limit_n = float(limit) if isinstance(limit, int | float) and not isinstance(
            limit, bool) and limit > 0 else None
        out.append({"name": name, "used": float(used), "text": text, "limit": limit_n,
                    "limit_text": (f"{limit_n:.4f}" if name == "Cost" else f"{int(limit_n):,}")
                    if limit_n is not None else None,
                    "percent": None if limit_n is None else round(100 * float(used) / limit_n, 1)})
    deadline = budget.get("deadline_s")
    if isinstance(deadline, int | float) and not isinstance(deadline, bool) and deadline > 0:
        out.append({"name": "Time since submit", "used": elapsed, "text": duration(elapsed),
                    "limit": float(deadline), "limit_text": duration(float(deadline)),
                    "percent": round(100 * elapsed / float(deadline), 1)})
    return out
