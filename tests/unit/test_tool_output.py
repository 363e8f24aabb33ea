"""A tool's output cut into events: whole lines, bounded, in order."""

from __future__ import annotations

from runlease.worker.tool_output import LINE_MAX_CHARS, OutputEvents


def texts(events: list[tuple[str, dict[str, object]]]) -> list[tuple[object, object]]:
    return [(d["stream"], d["text"]) for _, d in events]


def test_whole_lines_only_until_the_tool_ends() -> None:
    out = OutputEvents("tool.output", {"step": 1})
    out.feed("stdout", b"one\ntw")
    assert texts(out.take()) == [("stdout", "one\n")]
    out.feed("stdout", b"o\nthr")
    out.feed("stderr", b"oops\n")
    events = out.take()
    assert texts(events) == [("stdout", "two\n"), ("stderr", "oops\n")]
    assert events[0] == ("tool.output", {"step": 1, "stream": "stdout", "text": "two\n"})
    assert texts(out.finish()) == [("stdout", "thr")]


def test_a_character_split_between_chunks_is_whole() -> None:
    out = OutputEvents("tool.output")
    data = "héllo ✓\n".encode()
    for i in range(len(data)):
        out.feed("stdout", data[i:i + 1])
    assert texts(out.finish()) == [("stdout", "héllo ✓\n")]


def test_lines_coalesce_and_long_lines_are_cut() -> None:
    out = OutputEvents("tool.output")
    out.feed("stdout", b"a\nb\n" + b"x" * (LINE_MAX_CHARS + 10))
    events = texts(out.take())
    assert events[0] == ("stdout", "a\nb\n" + "x" * LINE_MAX_CHARS)
    assert texts(out.finish()) == [("stdout", "x" * 10)]


def test_output_past_the_bound_is_left_out_with_a_note() -> None:
    out = OutputEvents("tool.output", max_bytes=100)
    for _ in range(50):
        out.feed("stdout", b"0123456789\n")
    events = out.take() + out.finish()
    shown = "".join(str(d["text"]) for _, d in events if d["stream"] == "stdout")
    assert len(shown) == 100
    note = events[-1][1]
    assert note["truncated"] is True
    assert "450 more bytes" in str(note["text"])
