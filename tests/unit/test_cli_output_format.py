"""cli/output.py without a server: cells, ages, column widths, -o name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from uuid import UUID

from runlease.cli.output import Column, age, cell, iso, jsonable, names, render, until

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_cells_are_one_printable_line() -> None:
    assert cell(None) == cell("") == "<none>"
    assert (cell(True), cell(False)) == ("true", "false")
    assert cell({"a": [1, 2]}) == '{"a":[1,2]}'
    # A hostile tenant's label or error code cannot break a row or drive the terminal.
    assert cell("a\nb\x1b[2Jc\td") == "a?b?[2Jc?d"


def test_times_are_rfc3339_utc_as_the_api_writes_them() -> None:
    berlin = timezone(timedelta(hours=1))
    assert iso(datetime(2026, 12, 1, 13, 0, tzinfo=berlin)) == "2026-12-01T12:00:00Z"
    assert iso(datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)) == \
        "2026-12-01T12:00:00.123456Z"
    assert jsonable({"at": NOW, "id": UUID(int=1)}) == {
        "at": "2026-12-01T12:00:00Z", "id": "00000000-0000-0000-0000-000000000001"}


def test_ages_as_kubectl_prints_them() -> None:
    assert [age(NOW - timedelta(seconds=s), NOW) for s in (0, 59, 60, 3599, 3600, 86_400 * 3)] \
        == ["0s", "59s", "1m", "59m", "1h", "3d"]
    assert age(NOW + timedelta(seconds=5), NOW) == "0s"  # a clock ahead of ours
    assert until(NOW + timedelta(hours=7), NOW) == "in 7h"
    assert until(NOW - timedelta(hours=1), NOW) == "now"


def test_columns_are_as_wide_as_their_widest_cell() -> None:
    columns = [Column("ID", lambda r: r[0]), Column("STATUS", lambda r: r[1]),
               Column("ERROR", lambda r: r[2], wide=True)]
    rows = [("a", "cancelled", None), ("bbbb", "done", "refused")]
    assert render(rows, columns, wide=False, headers=True).splitlines() == [
        "ID     STATUS", "a      cancelled", "bbbb   done"]
    assert render(rows, columns, wide=True, headers=False).splitlines() == [
        "a      cancelled   <none>", "bbbb   done        refused"]
    assert render([], columns, wide=False, headers=False) == ""


def test_name_output_is_ids_or_names() -> None:
    assert names({"items": [{"id": "x"}, {"id": "y"}], "next_cursor": None}) == ["x", "y"]
    assert names([{"name": "default"}]) == ["default"]
    assert names({"op_id": "o", "ids": ["a", "b"]}) == ["a", "b"]
    assert names({"id": "one"}) == ["one"]
