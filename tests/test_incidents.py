"""Incidents and the flight recorder, fast: each rule pinned on both sides of its boundary."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from test_goodput import REPO, _run, _step, _write, hand_run

from fsdpmon.conventions import (
    CHECKPOINT_SHARE_LIMIT,
    DIAGNOSIS_EVIDENCE_SECONDS,
    STRAGGLER_SCORE_THRESHOLD,
)
from fsdpmon.diagnose.after import slow_save_groups
from fsdpmon.diagnose.findings import SLOWDOWN_CAUSES
from fsdpmon.diagnose.replay import run_stragglers
from fsdpmon.incidents.history import _increase, spans
from fsdpmon.incidents.incidents import (
    Incident,
    incidents,
    lemon_nodes,
)
from fsdpmon.job.run_goodput import goodput
from fsdpmon.job.runlog import load_run
from fsdpmon.monitor import flight
from fsdpmon.monitor.flight import FlightRecorder
from fsdpmon.monitor.stacks import MAX_TEXT


def _found(logs) -> list[Incident]:
    run = load_run(logs)
    return incidents(run, goodput(run, run_stragglers(run)))


def test_a_killed_rank_is_named_from_the_files_alone(tmp_path):
    found = _found(hand_run(tmp_path))
    restart = [i for i in found if i.cause == "rank_missing"]
    assert len(restart) == 1 and restart[0].rank == 1 and restart[0].node == "n1", found
    assert restart[0].pod == "p1"
    assert any("rank 1 died without exiting" in e for e in restart[0].evidence)
    # restart + recompute of rank 1 (21 + 2.5 s), on both GPUs
    assert restart[0].lost_gpu_seconds == pytest.approx(2 * 23.5)
    # rank 1's slow loader (steps 2-4) is too short for the monitor to score: no door names it
    assert not [i for i in found if i.cause in SLOWDOWN_CAUSES], found


def _stall_run(tmp_path, late_by: float, phases=("forward", "forward", "forward"),
               ranks: int = 3):
    """A stall at 200 (threshold 4 s); rank 1 saw it ``late_by`` s after its threshold."""
    for rank in range(ranks):
        seen_after = 4.0 + (late_by if rank == 1 else 0.5)
        _write(tmp_path / f"run.rank{rank}.jsonl", [
            {**_run(rank, 100.0), "world_size": ranks},
            _step(rank, 1, 199.0), _step(rank, 2, 200.0),
            {"kind": "stall", "state": "start", "time": 200.0 + seen_after, "rank": rank,
             "step": 2, "since": 200.0, "threshold": 4.0, "phase": phases[rank],
             "last_collective": {"op": "all_reduce", "seq": 7},
             "frames": [{"file": "train.py", "line": 3, "function": f"f{rank}"}]},
            _step(rank, 3, 210.0, seconds=10.0, wait=0.0 if rank == 1 else 9.0),
            {"kind": "stall", "state": "end", "time": 210.0, "rank": rank, "step": 3,
             "since": 200.0, "seconds": 9.0, "during": "step"}])
    return _found(tmp_path)


@pytest.mark.parametrize("late_by, cause, rank", [
    (2.5, "rank_unresponsive", 1),  # it ran no Python meanwhile
    (1.5, "hang", None),  # in time: all waited alike, and no stack stands out
])
def test_the_stall_s_culprit_is_the_rank_that_saw_it_late(tmp_path, late_by, cause, rank):
    stalls = [i for i in _stall_run(tmp_path, late_by) if i.cause in ("hang",
                                                                     "rank_unresponsive")]
    assert [(i.cause, i.rank) for i in stalls] == [(cause, rank)], stalls
    assert stalls[0].lost_gpu_seconds == pytest.approx(3 * 9.0)
    assert any("in phase forward, last collective all_reduce: f0 (train.py:3)" in e
               for e in stalls[0].evidence), stalls[0].evidence


def test_without_a_late_rank_the_odd_phase_names_the_culprit(tmp_path):
    stalls = [i for i in _stall_run(tmp_path, 0.0, phases=("forward", "data", "forward"))
              if i.cause == "hang"]
    assert [i.rank for i in stalls] == [1], stalls


def _straggling_run(tmp_path, slow_steps, extra: float, score: float | None = None):
    """Log windows of one 1 s step ending each second; in ``slow_steps`` rank 1 waits
    ``extra`` s more for data and rank 0 waits it out in its collectives. Each record carries
    the figures the monitor publishes with it (busy time, data wait, straggler score: the
    others' busy time over its own, or ``score``), which the judge reads."""
    for rank in (0, 1):
        recs = [_run(rank, 100.0)]
        for step in range(1, 31):
            more = extra if step in slow_steps else 0.0
            busy = 1.0 + (more if rank == 1 else 0.0)
            own = (score if score is not None and more else 1.0 / busy) if rank == 1 else busy
            recs.append({**_step(rank, step, 100.0 + step, 1.0 + more,
                                 data=more * (rank == 1), wait=more * (rank == 0)),
                         "step_time_s": 1.0 + more, "busy_s": busy,
                         "data_wait_ratio": more * (rank == 1) / (1.0 + more),
                         "straggler_score": own})
        _write(tmp_path / f"run.rank{rank}.jsonl", recs)
    return [i for i in _found(tmp_path) if i.cause in SLOWDOWN_CAUSES]


@pytest.mark.parametrize(("last", "named"), [(11, 0), (12, 1)])
def test_a_straggler_is_named_once_its_score_held_as_long_as_the_live_judge_needs(
        tmp_path, last, named):
    assert DIAGNOSIS_EVIDENCE_SECONDS == 10.0  # the steps below are written for it
    found = _straggling_run(tmp_path, set(range(2, last + 1)), 0.5)
    assert [(i.cause, i.rank) for i in found] == [("straggler_data", 1)] * named, found
    if named:  # its evidence from step 2 (10 s before step 12) on; 11 steps x 0.5 s, 2 GPUs
        assert (found[0].start, found[0].end) == (102.0, 112.0), found
        assert found[0].lost_gpu_seconds == pytest.approx(2 * 11 * 0.5)


@pytest.mark.parametrize(("extra", "named"), [(0.09, 0), (0.091, 1)])
def test_a_straggling_stretch_that_cost_less_than_a_second_is_noise(tmp_path, extra, named):
    found = _straggling_run(tmp_path, set(range(2, 13)), extra, score=0.5)  # 11 steps
    assert len(found) == named, found


@pytest.mark.parametrize(("score", "named"), [(STRAGGLER_SCORE_THRESHOLD, 0),
                                              (STRAGGLER_SCORE_THRESHOLD - 0.01, 1)])
def test_the_recorded_score_against_the_line_decides_as_it_does_live(tmp_path, score, named):
    assert len(_straggling_run(tmp_path, set(range(2, 15)), 0.5, score=score)) == named


def test_a_window_that_looks_slow_without_a_low_score_is_no_straggler(tmp_path):
    """The files' door of the CI flake (test_e2e_goodput): rank 1's step less its wait looks
    slow, but the score the monitor recorded with it is healthy: the judge names nobody."""
    assert _straggling_run(tmp_path, set(range(2, 20)), 0.5, score=1.0) == []


def _save(step: int, seconds: float, rank: int = 0) -> dict:
    return {"step": step, "seconds": seconds, "rank": rank, "time": float(step)}


def test_slow_saves_in_a_row_are_one_fault_a_healthy_save_splits_them():
    limit = CHECKPOINT_SHARE_LIMIT
    over, under = limit + 0.01, limit - 0.01
    one = slow_save_groups([(_save(10, 0.1), 0.05), (_save(20, 2.0), over),
                            (_save(30, 2.0), under), (_save(40, 2.0), over)])
    assert [[s["step"] for s, _ in g] for g in one] == [[20, 30, 40]]
    # a save below twice the fastest, or of another culprit, ends the run of slow ones
    two = slow_save_groups([(_save(10, 0.1), 0.05), (_save(20, 2.0), over),
                            (_save(30, 0.19), under), (_save(40, 2.0), over)])
    assert [[s["step"] for s, _ in g] for g in two] == [[20], [40]]
    still = slow_save_groups([(_save(10, 0.1), 0.05), (_save(20, 2.0), over),
                              (_save(30, 0.21), under), (_save(40, 2.0), over)])
    assert [[s["step"] for s, _ in g] for g in still] == [[20, 30, 40]]
    other = slow_save_groups([(_save(20, 2.0), over), (_save(30, 2.0, rank=1), under)])
    assert [[s["step"] for s, _ in g] for g in other] == [[20]]


@pytest.mark.parametrize("slow, named", [(1.2, True), (0.9, False)])
def test_a_slow_save_is_an_incident_once_it_costs_a_second(tmp_path, slow, named):
    # saves after steps 2 and 4; the second takes ``slow`` s more than the first (0.1 s)
    for rank in (0, 1):
        recs = [_run(rank, 100.0)]
        t = 100.0
        for step in range(1, 6):
            t += 1.0 + (0.1 if step == 3 else 0.0) + (0.1 + slow if step == 5 else 0.0)
            recs.append(_step(rank, step, t, window=1.0 + (t > 103.5) * (0.1 + slow)))
            if step in (2, 4):
                took = 0.1 if step == 2 else 0.1 + slow
                recs.append({"kind": "checkpoint", "time": t + took, "rank": rank,
                             "step": step, "seconds": took, "own_seconds": took * (rank == 1)})
        _write(tmp_path / f"run.rank{rank}.jsonl", recs)
    found = [(i.cause, i.rank) for i in _found(tmp_path)]
    assert found == ([("checkpoint_slow", 1)] if named else []), found


def test_a_nan_s_birthplace_costs_nothing_and_a_gpu_rank_names_its_gpu(tmp_path):
    for rank in (0, 1):
        _write(tmp_path / f"run.rank{rank}.jsonl", [
            {**_run(rank, 100.0), "device": "NVIDIA H100", "local_rank": rank},
            _step(rank, 1, 101.0),
            *([{"kind": "nonfinite", "time": 101.5, "rank": 1, "what": "loss", "step": 2,
                "batch": {"position": 8}}] if rank == 1 else []),
            _step(rank, 2, 102.0)])
    (nan,) = _found(tmp_path)
    assert (nan.cause, nan.rank, nan.gpu, nan.lost_gpu_seconds) == ("loss_nonfinite", 1, "1",
                                                                   0.0)
    assert "batch {'position': 8}" in nan.evidence[0]


def test_lemon_nodes_are_culprits_in_several_runs():
    def at(node: str, run: str) -> Incident:
        return Incident(0, 1, "hang", 0, "", node, "", (), 10.0, run=run)
    found = [at("a", "r1"), at("a", "r1"), at("a", "r2"), at("b", "r1"), at("", "r3")]
    assert lemon_nodes(found, min_runs=2) == [("a", 2, 30.0)]
    assert lemon_nodes(found, min_runs=1)[1] == ("b", 1, 10.0)


def test_incidents_command_json_and_flags(tmp_path):
    logs = hand_run(tmp_path)
    done = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "incidents", str(logs),
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert list(doc) == ["incidents"] and doc["incidents"]
    for item in doc["incidents"]:
        assert list(item) == ["start", "end", "cause", "rank", "pod", "node", "gpu",
                              "evidence", "lost_gpu_seconds"]
    for flags, field in ((["--prometheus", "http://127.0.0.1:1"], "--job"),
                         (["--job", "x"], "--prometheus"), ([], "RUN"),
                         ([str(logs), "--lemon-runs", "0"], "--lemon-runs")):
        bad = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "incidents", *flags],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and field in bad.stderr and "Traceback" not in bad.stderr


def test_history_spans_and_counter_increase():
    samples = [(0, 0), (1, 1), (2, 1), (3, 0), (4, 1), (9, 1)]
    # a sample saying otherwise ends a stretch; so does a gap longer than ``gap`` (no samples)
    assert spans(samples, lambda v: v >= 1, gap=3) == [(1, 2), (4, 4), (9, 9)]
    assert spans(samples, lambda v: v >= 1, gap=5) == [(1, 2), (4, 9)]
    # a stretch longer than the gap, sampled within it, stays one
    assert spans([(t, 1) for t in range(6)], lambda v: v >= 1, gap=3) == [(0, 5)]
    # a counter reset (the restarted process) counts from zero
    assert _increase([(0, 1.0), (1, 3.0), (2, 0.5), (3, 2.0)], 0, 3) == 2.0 + 0.5 + 1.5
    assert _increase([(0, 1.0), (1, 3.0)], 1, 3) == 0.0
    assert _increase([(0, 2.0), (1, 2.0), (2, 2.5)], 0, 2) == 0.5  # flat is no rise, no reset


def test_the_flight_recorder_writes_a_stall_once_bounded_and_its_end():
    written: list[dict] = []
    entered = threading.Event()
    release = threading.Event()

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        else:
            entered.set()
            release.wait(10)

    worker = threading.Thread(target=deep, args=(flight.MAX_FRAMES + 20,))
    worker.start()
    try:
        assert entered.wait(10)
        rec = FlightRecorder(3, written.append, worker.ident)
        rec.stall_started(100.0, 4.0, 7, "data" * 100, ("all_reduce", 12))
        rec.stall_started(101.0, 4.0, 7, "data", None)  # the same stall: nothing more
    finally:
        release.set()
        worker.join()
    assert len(written) == 1
    start = written[0]
    # the innermost frames, where it is stuck: the outer ones (thread start-up) are cut
    assert len(start["frames"]) == flight.MAX_FRAMES
    assert start["frames"][0]["function"] == "deep" and start["frames"][-1]["function"] == "wait"
    assert len(start["phase"]) == MAX_TEXT and start["last_collective"] == {
        "op": "all_reduce", "seq": 12}
    assert len(json.dumps(start)) <= flight.MAX_FRAMES * (3 * MAX_TEXT) + 2 * MAX_TEXT + 400
    lost = rec.stall_ended(8, "step", [0.5, 1.0, 2.0])
    assert written[-1]["state"] == "end" and written[-1]["seconds"] == lost
    assert lost == pytest.approx(written[-1]["time"] - 100.0 - 1.0)  # less one median step
    assert rec.stall_ended(9, "step", [1.0]) == 0.0 and len(written) == 2, "ended once"
    rec.stall_started(200.0, 4.0, 9, "checkpoint", None)
    assert rec.stall_ended(9, "checkpoint", [1.0]) == 0.0, "a long save is not a stall"
    assert written[-1]["during"] == "checkpoint"


def test_the_monitor_writes_the_records_a_run_s_story_needs(tmp_path):
    """In one process (rank 0 of 1): the run's process start, each window's figures, a save,
    a restore, the end; the served goodput counters; and `fsdpmon goodput` reads them back
    with every part summing to the wall."""
    import time

    from test_monitor import config, monitor, train

    from fsdpmon.monitor.flight import process_start_unix

    before = time.time()
    mon = monitor(config(tmp_path, log_interval=2, port=0))
    mon.checkpoint_restored(0, 0.25)
    train(mon, steps=4)
    with mon.phase("checkpoint"):
        time.sleep(0.05)
    train(mon, steps=2)
    mon.close()
    records = [json.loads(line) for line in (tmp_path / "run.rank0.jsonl").open()]
    kinds = [r["kind"] for r in records]
    assert kinds == ["run", "restore", "step", "step", "checkpoint", "step", "end"], kinds
    run, steps = records[0], [r for r in records if r["kind"] == "step"]
    assert run["process_start"] == pytest.approx(process_start_unix(), abs=0.02)
    assert run["process_start"] <= before
    assert [s["steps"] for s in steps] == [2, 2, 2]
    for s in steps:
        assert 0 < s["step_seconds"] <= s["window_seconds"] and s["data_seconds"] >= 0
        assert s["wait_seconds"] == 0.0, "one rank waits for nobody"
    assert records[4]["seconds"] >= 0.05 and records[4]["step"] == 4
    assert records[-1]["how"] == "exit" and records[-1]["step"] == 6
    gp = goodput(load_run(tmp_path / "run.jsonl"))
    assert gp.badput_seconds["checkpoint_restore"] == 0.25
    assert gp.badput_seconds["checkpoint_save"] == records[4]["seconds"]
    assert gp.productive_seconds + sum(gp.badput_seconds.values()) == pytest.approx(
        gp.wall_seconds, rel=1e-9)
    assert mon.goodput.badput["checkpoint_save"] == records[4]["seconds"]
    assert mon.goodput.productive == pytest.approx(gp.productive_seconds, abs=1e-9)
