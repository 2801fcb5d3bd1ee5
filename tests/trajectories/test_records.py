"""JSON-lines files (`records.py`): one rule for a line a crash tore, for every JSONL we write."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import BaseModel

from art_langgraph.errors import UsageError
from art_langgraph.trajectories.records import append_records, read_records, write_records


class Row(BaseModel):
    step: int
    note: str = ""


def test_records_round_trip_as_dicts_and_as_models(tmp_path: Path) -> None:
    f = tmp_path / "sub" / "h.jsonl"
    assert append_records(f, [Row(step=1), {"step": 2, "note": "x"}]) == 2
    assert append_records(f, []) == 0
    assert read_records(f) == [{"step": 1, "note": ""}, {"step": 2, "note": "x"}]
    assert read_records(f, Row) == [Row(step=1), Row(step=2, note="x")]
    assert write_records(f, [Row(step=3)]) == 1
    assert read_records(f, Row) == [Row(step=3)]


def test_a_torn_tail_is_skipped_on_read_and_cut_before_the_next_append(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "h.jsonl"
    append_records(f, [{"step": 1}, {"step": 2}])
    with open(f, "ab") as raw:  # a process killed mid-append
        raw.write(b'{"step": 3, "no')
    with caplog.at_level(logging.WARNING, logger="art_langgraph.trajectories.records"):
        assert read_records(f) == [{"step": 1}, {"step": 2}]
    assert "torn" in caplog.text
    append_records(f, [{"step": 4}])  # never joins the torn bytes
    assert read_records(f) == [{"step": 1}, {"step": 2}, {"step": 4}]
    assert f.read_bytes().endswith(b'{"step": 4}\n')


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path: Path) -> None:
    """A file written by hand often lacks the final newline: that is no torn line."""
    f = tmp_path / "h.jsonl"
    f.write_text('{"step": 1}\n{"step": 2}')
    assert read_records(f) == [{"step": 1}, {"step": 2}]
    append_records(f, [{"step": 3}])
    assert read_records(f) == [{"step": 1}, {"step": 2}, {"step": 3}]


def test_a_bad_line_that_is_not_the_last_is_an_error_naming_it(tmp_path: Path) -> None:
    f = tmp_path / "h.jsonl"
    f.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(UsageError, match=r"h\.jsonl:2: not a valid JSON object"):
        read_records(f)
    f.write_text('{"step": 1}\n[1, 2]\n')
    with pytest.raises(UsageError, match=r":2: .*not an object"):
        read_records(f)
    f.write_text('{"step": "x"}\n')
    with pytest.raises(UsageError, match=r":1: not a valid Row \(see\)"):
        read_records(f, Row, hint=lambda line: " (see)")


def test_a_missing_file_is_an_error_unless_allowed(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_records(tmp_path / "none.jsonl")
    assert read_records(tmp_path / "none.jsonl", missing_ok=True) == []
