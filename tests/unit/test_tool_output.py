"""A tool's output cut into events: never inside a secret, bounded, in order."""

from __future__ import annotations

from runlease.core.redact import DEFAULT_REDACTOR, MASK
from runlease.worker.tool_output import EVENT_MAX_CHARS, OutputEvents

KEY = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo\n"
       "4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onL\n-----END RSA PRIVATE KEY-----\n")


def texts(events: list[tuple[str, dict[str, object]]]) -> list[tuple[object, object]]:
    return [(d["stream"], d["text"]) for _, d in events]


def test_text_waits_for_a_safe_cut_until_the_tool_ends() -> None:
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
    assert "".join(str(t) for _, t in texts(out.take() + out.finish())) == "héllo ✓\n"


def test_a_key_printed_line_by_line_never_reaches_an_event_in_pieces() -> None:
    out = OutputEvents("tool.output")
    stored = []
    for line in ("build ok\n" + KEY + "done\n").splitlines(keepends=True):
        out.feed("stdout", line.encode())
        # What the store would keep: each event redacted alone.
        stored += [DEFAULT_REDACTOR.text(str(d["text"])) for _, d in out.take()]
    stored += [DEFAULT_REDACTOR.text(str(d["text"])) for _, d in out.finish()]
    joined = "".join(stored)
    assert "MIIEow" not in joined
    assert "4lgOEePz" not in joined
    assert MASK in joined
    assert joined.startswith("build ok\n")
    assert joined.endswith("done\n")


def test_long_output_is_cut_into_bounded_events() -> None:
    out = OutputEvents("tool.output")
    out.feed("stdout", b"word " * 8000)
    events = out.take() + out.finish()
    assert all(len(str(d["text"])) <= EVENT_MAX_CHARS for _, d in events)
    assert "".join(str(d["text"]) for _, d in events) == "word " * 8000


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
