"""The JSONL sink's file naming and robustness."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from fsdpmon.monitor.jsonl import JsonlSink, rank_path, read_records


def test_rank_suffix_goes_before_the_extension():
    assert rank_path("runs/x.jsonl", 3) == Path("runs/x.rank3.jsonl")
    assert rank_path("runs/x", 0) == Path("runs/x.rank0.jsonl")


def test_lines_are_flushed_and_nonfinite_values_become_null(tmp_path):
    sink = JsonlSink(tmp_path / "deep" / "run.jsonl", 1)
    sink.write({"kind": "step", "loss": math.nan, "job": {"loss_max": math.inf}})
    # Flushed per line: readable before close, as a crash would leave it.
    line = json.loads((tmp_path / "deep" / "run.rank1.jsonl").read_text())
    assert line == {"kind": "step", "loss": None, "job": {"loss_max": None}}
    sink.close()
    sink.write({"after": "close"})  # ignored, never raises


def test_reader_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "x.rank0.jsonl"
    path.write_text('{"kind": "run"}\n{"kind": "step", "step": 1}\n{"kind": "st')
    assert read_records(path) == [{"kind": "run"}, {"kind": "step", "step": 1}]


def test_a_resumed_run_cuts_a_torn_last_record_off_with_a_warning(tmp_path, caplog):
    sink = JsonlSink(tmp_path / "x.jsonl", 0)
    sink.write({"kind": "run", "n": 1})
    sink.write({"kind": "step", "n": 2})
    sink.close()
    with rank_path(tmp_path / "x.jsonl", 0).open("a") as fh:
        fh.write('{"kind": "step", "n": 3, "lo')  # the process died mid-write
    with caplog.at_level(logging.WARNING, logger="fsdpmon.monitor.jsonl"):
        sink = JsonlSink(tmp_path / "x.jsonl", 0)
    sink.write({"kind": "run", "n": 4})
    sink.close()
    path = rank_path(tmp_path / "x.jsonl", 0)
    assert [r["n"] for r in read_records(path)] == [1, 2, 4]
    assert path.read_text().count("\n") == 3
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and f"{path}:3: removed a record cut short" in messages[0], messages
