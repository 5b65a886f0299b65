"""The flight recorder's own figures, fast: the process start it stamps on the run record, the
time a stall lost, how the process ended, and the warning it logs (benchmarks/mutation.py)."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import psutil

from fsdpmon.monitor import exit_cleanup
from fsdpmon.monitor.flight import FlightRecorder, process_start_unix

TICK = 1.0 / os.sysconf("SC_CLK_TCK")


def test_the_process_start_is_the_kernel_s_even_for_a_name_with_a_parenthesis():
    # psutil reads the same clock ticks since boot: the two agree to a tick's rounding
    expected = psutil.Process().create_time()
    assert abs(process_start_unix() - expected) <= 2 * TICK, (process_start_unix(), expected)
    comm = Path("/proc/self/comm")
    name = comm.read_text().rstrip("\n")
    try:
        comm.write_text("a) b) c")  # /proc/self/stat's name field is "(a) b) c)"
        assert abs(process_start_unix() - expected) <= 2 * TICK, process_start_unix()
    finally:
        comm.write_text(name)


def recorder() -> tuple[FlightRecorder, list[dict]]:
    written: list[dict] = []
    return FlightRecorder(2, written.append, threading.get_ident()), written


def test_a_stall_s_loss_is_beyond_one_median_step_never_below_zero():
    rec, written = recorder()
    rec.stall_started(time.time() - 3.0, 1.0, 5, "forward", None)
    lost = rec.stall_ended(6, "step", [])
    assert lost == written[-1]["time"] - written[-1]["since"], "no steps known: all of it"
    rec.stall_started(time.time(), 1.0, 6, "forward", None)
    assert rec.stall_ended(7, "step", [5.0]) == 0.0, "shorter than a step: nothing lost"
    assert written[-1]["seconds"] == 0.0 and written[-1]["during"] == "step"


def test_the_end_record_says_how_the_process_ended(monkeypatch):
    rec, written = recorder()
    rec.ended(9, None)
    rec.ended(9, ValueError("bad"))
    monkeypatch.setattr(exit_cleanup, "_ending", "sigterm")
    rec.ended(9, None)
    assert [(r["how"], r["step"], r["detail"]) for r in written] == [
        ("exit", 9, ""), ("error", 9, "ValueError"), ("sigterm", 9, "")], written


def test_the_warning_names_the_three_innermost_frames_or_a_dash(caplog):
    rec, _ = recorder()

    def one():  # on its own thread, the innermost are the recorder's own calls
        with caplog.at_level(logging.WARNING, logger="fsdpmon.monitor"):
            rec.stall_started(100.0, 4.0, 7, "data", ("all_reduce", 3))
    one()
    message = caplog.records[-1].getMessage()
    where = [w.rsplit(" ", 1)[1] for w in message.split("innermost frames: ")[1].split("; ")]
    assert where == ["one", "stall_started", "thread_frames"], message
    assert "in phase data," in message, message
    gone = FlightRecorder(0, lambda r: None, -1)  # a thread that is no more
    with caplog.at_level(logging.WARNING, logger="fsdpmon.monitor"):
        gone.stall_started(100.0, 4.0, 7, "", None)
    message = caplog.records[-1].getMessage()
    assert "in phase -," in message and message.endswith("innermost frames: -"), message



def test_a_stall_record_names_the_call_it_waits_in_decoded_from_the_wrapper_s_codes(monkeypatch):
    from fsdpmon.conventions import DTYPE_NAMES, OPS
    from fsdpmon.monitor import collectives

    calls = collectives._calls
    for field, value in (("code", OPS.index("all_reduce") + 1), ("elems", 1024),
                         ("dtype", DTYPE_NAMES.index("bfloat16") + 1), ("off_pattern", 1)):
        monkeypatch.setattr(calls, field, value)
    rec, written = recorder()
    rec.stall_started(time.time() - 3.0, 1.0, 5, "forward", ("all_reduce", 41))
    assert written[0]["call"] == {"op": "all_reduce", "elements": 1024, "dtype": "bfloat16",
                                  "off_pattern": True}, written[0]["call"]
    monkeypatch.setattr(calls, "code", 0)  # no collective entered yet
    rec, written = recorder()
    rec.stall_started(time.time() - 3.0, 1.0, 5, "forward", None)
    assert written[0]["call"] is None, written[0]["call"]
