"""The collectives' identity travels from the rank's heartbeat to the served series and the
scraped row (issue 51): published after a step, absent before one and from an older writer."""

from __future__ import annotations

import dataclasses

from test_monitor_collector import NOW, _exposition, _state, _values

from fsdpmon import catalog
from fsdpmon.monitor.heartbeat import HB_CALLS, HB_CALLS_AT, HB_SIZE, read_heartbeat
from fsdpmon.monitor.state import RankState, RankStateWriter
from fsdpmon.scrape.rows import rank_row
from fsdpmon.scrape.wanted import RANK_METRICS

CALLS = (3.0, 123456789.0, 40.0, 1.0, 1024.0, 1.0, 1.0)  # all_reduce 1024 float32, off pattern
POSITION = (41.0, 40.0, 1.0, 2.0, NOW - 3)
SERIES = (catalog.TRAIN_STEP_COLLECTIVE_CALLS, catalog.TRAIN_STEP_COLLECTIVE_FINGERPRINT,
          catalog.TRAIN_STEP_COLLECTIVE_END_SEQ, catalog.TRAIN_COLLECTIVE_ENTERED_OP,
          catalog.TRAIN_COLLECTIVE_ENTERED_ELEMENTS, catalog.TRAIN_COLLECTIVE_ENTERED_DTYPE,
          catalog.TRAIN_COLLECTIVE_ENTERED_OFF_PATTERN)


def test_the_heartbeat_carries_the_identity_and_an_older_file_has_none(tmp_path):
    writer = RankStateWriter(tmp_path / "state", 0)
    writer.heartbeat(NOW, 5, 5, 5, 0, 60, NOW, POSITION, CALLS)
    raw = writer.hb_path.read_bytes()
    writer.close()
    assert len(raw) == HB_SIZE
    hb = read_heartbeat_bytes(tmp_path / "new.hb", raw)
    assert (hb.step_calls, hb.step_fingerprint, hb.step_end_seq, hb.entered_op,
            hb.entered_elements, hb.entered_dtype, hb.entered_off_pattern) == CALLS
    older = read_heartbeat_bytes(tmp_path / "old.hb", raw[:HB_CALLS_AT])  # the 128-byte file
    assert older.step_calls == -1.0 and older.collective_entered == 41.0
    torn = bytearray(raw)
    *values, seq = HB_CALLS.unpack_from(raw, HB_CALLS_AT)
    HB_CALLS.pack_into(torn, HB_CALLS_AT, *values, seq - 1)
    (tmp_path / "torn.hb").write_bytes(bytes(torn))
    assert read_heartbeat(tmp_path / "torn.hb") is None  # never one write's mixed with another's


def read_heartbeat_bytes(path, raw):
    path.write_bytes(raw)
    hb = read_heartbeat(path)
    assert hb is not None
    return hb


def _served(**heartbeat) -> str:
    state = _state(0, NOW - 1)
    hb = dataclasses.replace(state.heartbeat, phase=0.0, position_since_unix=NOW - 3, **heartbeat)
    return _exposition([RankState(0, state.snapshot, hb)])


def test_served_after_a_step_and_not_before():
    names = ("step_calls", "step_fingerprint", "step_end_seq", "entered_op",
             "entered_elements", "entered_dtype", "entered_off_pattern")
    fields = dict(zip(names, CALLS, strict=True))
    text = _served(**fields)
    assert [_values(text, m.name) for m in SERIES] == [{"0": v} for v in CALLS]
    unstepped = _served(**{**fields, "step_calls": -1.0})  # no fingerprint for the step named
    assert [_values(unstepped, m.name) for m in SERIES] == [{}] * 3 + [{"0": v} for v in CALLS[3:]]
    older = _served()  # an older writer: neither
    assert [_values(older, m.name) for m in SERIES] == [{}] * len(SERIES)


def test_a_fingerprint_is_published_only_with_the_step_it_belongs_to(monkeypatch):
    from fsdpmon.monitor import collectives, publish

    monkeypatch.setattr(collectives, "entered_call", lambda: (1, 1024, 1, 0))
    same = publish._calls((7.0, (3, 99, 40)), 7.0)
    assert same == (3.0, 99.0, 40.0, 1.0, 1024.0, 1.0, 0.0)
    assert publish._calls((8.0, (3, 99, 40)), 7.0)[:3] == (-1.0, 0.0, 0.0)  # the next step's
    assert publish._calls(None, 0.0)[:3] == (-1.0, 0.0, 0.0)


def test_the_scraped_row_holds_the_identity():
    filed = {RANK_METRICS[m.name]: v for m, v in zip(SERIES, CALLS, strict=True)}
    row = rank_row(0, filed, NOW)
    assert (row.step_collectives, row.step_fingerprint, row.step_end_seq, row.entered_op,
            row.entered_elements, row.entered_dtype, row.entered_off_pattern) == (
        3, 123456789, 40, 1, 1024, 1, True)
    assert rank_row(1, {}, NOW).entered_op is None
