"""What the runs list says of each run: its title (given at submit), else
the first words of its input; and how long it took (or has taken so far)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from runlease.api.console.timeline import duration, seconds
from runlease.db.models import Run

SUMMARY_CHARS = 80
SUMMARY_WORDS = 12
# Input members that usually say what a run is about, tried first.
TELLING_KEYS = ("title", "prompt", "task", "question", "query", "message", "instruction",
                "goal", "text", "content", "input", "q")
MAX_VISITED = 200  # values looked at in an input, at most: inputs are large and hostile


def _strings(value: Any, budget: list[int]) -> Iterator[str]:
    """The input's strings, depth first, telling keys first at each level."""
    if budget[0] <= 0:
        return
    budget[0] -= 1
    if isinstance(value, str):
        if value.strip():
            yield value
    elif isinstance(value, dict):
        keys = [k for k in TELLING_KEYS if k in value]
        keys += [k for k in value if k not in TELLING_KEYS]
        for k in keys:
            yield from _strings(value[k], budget)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, budget)


def first_words(text: str) -> str:
    words = text.split()
    out = " ".join(words[:SUMMARY_WORDS])
    if len(out) > SUMMARY_CHARS:
        out = out[:SUMMARY_CHARS - 1].rstrip()
        return out + "\u2026"
    return out + ("\u2026" if len(words) > SUMMARY_WORDS else "")


def summary(run: Run) -> tuple[str, bool]:
    """(text, titled): the run's title, or the first words of its input."""
    if run.title:
        return run.title, True
    found = next(_strings(run.input_json, [MAX_VISITED]), None)
    return (first_words(found) if found else ""), False


def took(run: Run, now: datetime) -> tuple[str, bool]:
    """(duration, finished): submit to finish, or to now while it is not
    finished (display only: leases never read this clock)."""
    if run.finished_at is not None:
        return duration(seconds(run.created_at, run.finished_at)), True
    return duration(seconds(run.created_at, now)), False
