"""Goodput arithmetic, fast: the job's window split, the live meter, and a run's files split by
cause, each against figures worked out by hand (exact where the arithmetic is exact)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpmon.job.goodput import CATEGORIES, RankWindow, split_window
from fsdpmon.job.run_goodput import endings, goodput
from fsdpmon.job.runlog import load_run
from fsdpmon.monitor.goodput_meter import GoodputMeter

REPO = Path(__file__).resolve().parents[1]


def w(rank: int, step: float, data: float, wait: float, steps: int = 1) -> RankWindow:
    return RankWindow(rank, steps, step, data, wait)


def _parts(split) -> float:
    return split.productive + split.data_wait + split.straggler_wait + split.stall


def test_a_healthy_window_is_productive_but_for_its_data_time():
    split = split_window([w(0, 1.0, 0.01, 0.02), w(1, 1.0, 0.02, 0.01)])
    assert split.critical_rank == 1  # waited least
    assert (split.data_wait, split.stall) == (0.02, 0.0)
    assert split.straggler_wait == pytest.approx(0.0, abs=1e-12)  # own work 0.97 on both
    assert split.productive == pytest.approx(0.98, abs=1e-12)
    # a hundredth more own work on the waited-for rank is jitter, not a straggler
    slower = split_window([w(0, 1.0, 0.01, 0.02), w(1, 1.0, 0.01, 0.01)])
    assert slower.straggler_wait == 0.0 and slower.productive == pytest.approx(0.99)


@pytest.mark.parametrize("others_own, straggler", [(0.75, 0.0), (0.74, 0.26)])
def test_straggler_time_counts_from_the_diagnosis_threshold(others_own, straggler):
    # the waited-for rank's own work 1.0 s; the others' median own work 0.75 s is a score of
    # exactly 0.75: not a straggler; 0.74 s is
    wait = 1.0 - others_own
    split = split_window([w(0, 1.0, 0.0, wait), w(1, 1.0, 0.0, 0.0), w(2, 1.0, 0.0, wait)])
    assert split.straggler_wait == pytest.approx(straggler, abs=1e-12)


def test_a_data_slow_rank_costs_its_data_time_and_is_no_straggler():
    split = split_window([w(0, 1.3, 0.01, 0.31), w(1, 1.3, 0.31, 0.01), w(2, 1.3, 0.01, 0.30)])
    assert split.critical_rank == 1
    assert split.data_wait == 0.31
    # own work: rank 1 0.98, the others 0.98 and 0.99: it is no slower than their median
    assert split.straggler_wait == 0.0
    assert _parts(split) == pytest.approx(1.3, abs=1e-12)


def test_a_compute_straggler_costs_its_work_beyond_the_others_median():
    split = split_window([w(0, 1.0, 0.0, 0.4), w(1, 1.0, 0.0, 0.0), w(2, 1.0, 0.0, 0.5)])
    # own: 0.6, 1.0, 0.5 -> rank 1 waited for; the others' median own 0.55
    assert split.critical_rank == 1
    assert split.straggler_wait == pytest.approx(0.45, abs=1e-12)
    assert split.productive == pytest.approx(0.55, abs=1e-12)


def test_a_stall_is_taken_out_of_the_culprit_s_phase_that_held_it():
    # rank 1 stopped 5 s in its data phase: the others waited in a collective
    in_data = split_window([w(0, 6.0, 0.01, 5.02), w(1, 6.0, 5.02, 0.01)], stall=5.0)
    assert in_data.stall == 5.0 and in_data.data_wait == pytest.approx(0.02, abs=1e-12)
    assert in_data.straggler_wait == pytest.approx(0.0, abs=1e-12)
    # ... and 5 s in its forward: its own work, not a straggler's
    in_work = split_window([w(0, 6.0, 0.01, 5.02), w(1, 6.0, 0.01, 0.02)], stall=5.0)
    assert in_work.stall == 5.0 and in_work.straggler_wait == pytest.approx(0.0, abs=1e-9)
    assert _parts(in_work) == pytest.approx(6.0, abs=1e-12)


def test_a_stall_exactly_as_long_as_a_wait_or_a_data_phase():
    # waited exactly the stall: a victim; data exactly the stall: the stop was in the data phase
    split = split_window([w(0, 6.0, 0.0, 5.0), w(1, 6.0, 5.0, 0.0)], stall=5.0)
    assert (split.critical_rank, split.data_wait, split.stall) == (1, 0.0, 5.0)
    assert split.straggler_wait == 0.0 and split.productive == 1.0


def test_a_straggler_during_a_stall_still_costs_its_extra_work():
    # rank 1 stopped 5 s in its own work and 0.5 s slower than the others besides
    split = split_window([w(0, 6.5, 0.0, 5.5), w(1, 6.5, 0.0, 0.0), w(2, 6.5, 0.0, 5.5)],
                         stall=5.0)
    assert split.stall == 5.0 and split.straggler_wait == pytest.approx(0.5, abs=1e-12)
    assert split.productive == pytest.approx(1.0, abs=1e-12)


def test_one_rank_alone_waits_for_nobody_and_figures_past_the_step_are_capped():
    alone = split_window([w(0, 1.0, 0.2, 0.0)])
    assert (alone.data_wait, alone.straggler_wait, alone.productive) == (0.2, 0.0, 0.8)
    # a data phase longer than the step (clocks read apart): capped, nothing below zero
    odd = split_window([w(0, 1.0, 1.4, 0.0), w(1, 1.0, 0.0, 0.9)], stall=0.5)
    assert (odd.stall, odd.data_wait, odd.straggler_wait, odd.productive) == (0.5, 0.5, 0.0,
                                                                             0.0)
    lopsided = split_window([w(0, 1.0, 0.0, 0.0), w(1, 1.0, 0.0, 0.9), w(2, 1.0, 0.0, 0.9)],
                            stall=0.5)
    # rank 0 held the stall in its own work (0.5 s left of it); the others' own work 0.1 s
    assert lopsided.straggler_wait == pytest.approx(0.4, abs=1e-12)
    assert _parts(lopsided) == pytest.approx(1.0, abs=1e-12)


def test_a_stall_between_the_steps_is_taken_from_the_time_between_them():
    # rank 1 stopped 5 s in its log step: both ranks' steps are ordinary, the window is not
    split = split_window([w(0, 0.25, 0.0, 0.125), w(1, 0.25, 0.0, 0.125)], stall=5.0,
                         wall=5.375)
    assert (split.stall, split.stall_between, split.productive) == (5.0, 5.0, 0.25), split
    # never more than the time between them
    short = split_window([w(0, 0.25, 0.0, 0.125), w(1, 0.25, 0.0, 0.125)], stall=5.0,
                         wall=3.25)
    assert (short.stall, short.stall_between, short.productive) == (3.25, 3.0, 0.0), short


def test_a_stall_never_exceeds_the_window_and_ranks_without_steps_are_left_out():
    split = split_window([w(0, 1.0, 0.0, 0.0), w(1, 0.0, 0.0, 0.0, steps=0)], stall=9.0)
    assert split.stall == 1.0 and split.productive == 0.0
    assert split_window([w(0, 0.0, 0.0, 0.0, steps=0)]) is None
    assert split_window([]) is None


def test_the_meter_counts_startup_then_a_restart_and_its_recompute():
    meter = GoodputMeter(process_start=100.0)
    meter.first_step(now=105.0)
    assert meter.badput["startup"] == 5.0 and meter.badput["restart"] == 0.0
    meter.first_step(now=200.0)  # only the first counts
    assert meter.badput["startup"] == 5.0
    quick = GoodputMeter(process_start=100.0)
    quick.restore(step=3, seconds=0.1)
    quick.first_step(now=100.4)  # under a second, less the restore in it
    assert quick.badput["startup"] == pytest.approx(0.3, abs=1e-12)
    again = GoodputMeter(process_start=300.0)
    again.restart_from(step=37, last_progress=290.0)  # the previous life's last log step
    again.restore(step=30, seconds=0.5)
    again.first_step(now=310.0)
    assert again.badput["startup"] == 0.0
    assert again.badput["restart"] == pytest.approx(310.0 - 290.0 - 0.5)
    assert again.badput["checkpoint_restore"] == 0.5
    split = split_window([w(0, 0.2, 0.0, 0.0), w(1, 0.2, 0.0, 0.0)])
    again.window(split, [0.1, 0.3, 0.2])
    assert again.badput["recompute"] == pytest.approx(7 * 0.2)  # (37 - 30) x median step
    again.window(split, [0.1])
    assert again.badput["recompute"] == pytest.approx(7 * 0.2), "counted once"
    assert again.ratio() == 0.0, "fewer steps kept than made again: none, never below"
    again.window(split_window([w(0, 10.0, 0.0, 0.0), w(1, 10.0, 0.0, 0.0)]), [10.0])
    assert again.ratio() == pytest.approx((10.4 - 1.4) / (10.4 + 19.5 + 0.5), abs=1e-12)
    assert "unaccounted" not in again.served()


# ---- a run's files, made by hand --------------------------------------------------------

def _write(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")


def _run(rank: int, start: float, restarts: int = 0) -> dict:
    return {"kind": "run", "time": start + 1, "rank": rank, "world_size": 2, "node": f"n{rank}",
            "pod": f"p{rank}", "device": "cpu", "job_name": "hand", "process_start": start,
            "restarts": restarts, "local_rank": rank}


def _step(rank: int, step: int, end: float, seconds: float = 1.0, data: float = 0.0,
          wait: float = 0.0, window: float | None = None) -> dict:
    return {"kind": "step", "time": end, "rank": rank, "step": step,
            "window_seconds": window if window is not None else seconds,
            "step_seconds": seconds, "data_seconds": data, "wait_seconds": wait, "steps": 1}


def hand_run(root: Path) -> Path:
    """Two ranks. Life 0: started at 100, first step begins 110 (startup 10); steps 1..6 of
    1 s end at 111..116, rank 1's data 0.5 s in steps 2..4 (rank 0 waits it out); a save of
    2 s after step 3 (116 -> the windows shift); killed after step 6. Life 1: started 130,
    restored step 3 in 1 s, first step begins 140; steps 4..6 again end at 141..143."""
    logs = root / "logs"
    for rank in (0, 1):
        recs = [_run(rank, 100.0 + rank * 0.5)]
        t = 110.0
        for step in range(1, 7):
            slow = 2 <= step <= 4
            data = 0.5 if slow and rank == 1 else 0.0
            wait = 0.5 if slow and rank == 0 else 0.0
            window = 1.0 + (2.0 if step == 4 else 0.0)  # the save of step 3 falls in window 4
            t += window
            recs.append(_step(rank, step, t, 1.0, data, wait, window))
            if step == 3:
                recs.append({"kind": "checkpoint", "time": t + 2.0, "rank": rank, "step": 3,
                             "seconds": 2.0, "own_seconds": 1.5 if rank == 0 else 0.1})
        if rank == 0:
            recs.append({"kind": "end", "time": t + 1, "rank": 0, "how": "sigterm", "step": 6})
        recs += [_run(rank, 130.0, restarts=1),
                 {"kind": "restore", "time": 139.0, "rank": rank, "step": 3, "seconds": 1.0}]
        t = 140.0
        for step in range(4, 7):
            t += 1.0
            recs.append(_step(rank, step, t))
        _write(logs / f"run.rank{rank}.jsonl", recs)
    return logs


def test_a_run_split_by_cause_from_its_files(tmp_path):
    gp = goodput(load_run(hand_run(tmp_path)))
    bad = gp.badput_seconds
    assert list(bad) == list(CATEGORIES)
    assert gp.wall_seconds == 143.0 - 100.0
    assert bad["startup"] == 10.0
    assert bad["data_wait"] == pytest.approx(1.5) and gp.by_rank["data_wait"] == {1: 1.5}
    assert bad["checkpoint_save"] == 2.0 and gp.by_rank["checkpoint_save"] == {0: 2.0}
    assert bad["checkpoint_restore"] == 1.0
    # from the last step of life 0 (118) to life 1's first step's begin (140), less the restore
    assert bad["restart"] == pytest.approx(140.0 - 118.0 - 1.0)
    assert gp.by_rank["restart"] == {1: pytest.approx(21.0)}, "rank 1 left no end record"
    # steps 4..6 of life 0 were made again: what they were credited as productive (step 4
    # waited 0.5 s for rank 1's data: that stays data_wait)
    assert bad["recompute"] == pytest.approx(0.5 + 1 + 1)
    assert bad["stall"] == 0.0 and bad["straggler_wait"] == 0.0
    assert gp.productive_seconds == pytest.approx(6 - 1.5 - 2.5 + 3)
    assert bad["unaccounted"] == pytest.approx(0.0, abs=1e-9)
    assert gp.productive_seconds + sum(bad.values()) == pytest.approx(gp.wall_seconds)


def test_how_each_rank_ended_from_the_files_alone(tmp_path):
    run = load_run(hand_run(tmp_path))
    assert endings(*run.incarnations) == {0: ("sigterm", 6), 1: ("killed", 6)}
    # the restarted process's word (its exit record read back) wins over the files' silence
    run.incarnations[1].events.append({"kind": "exit", "rank": 0, "how": "killed", "step": 6,
                                       "time": 131.0})
    assert endings(*run.incarnations) == {0: ("killed", 6)}


def test_goodput_command_json_and_bad_input(tmp_path):
    logs = hand_run(tmp_path)
    done = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "goodput", str(logs), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert set(doc) == {"wall_seconds", "productive_seconds", "goodput_ratio", "badput_seconds"}
    assert list(doc["badput_seconds"]) == list(CATEGORIES)
    assert doc["goodput_ratio"] == pytest.approx(doc["productive_seconds"] / 43.0)
    missing = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "goodput",
                              str(tmp_path / "nowhere")], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert missing.stderr.count("\n") == 1 and "nowhere" in missing.stderr, missing.stderr


def test_the_meter_adds_each_window_s_badput_and_restarts_from_its_own_step():
    meter = GoodputMeter(process_start=0.0)
    assert meter.ratio() is None, "nothing counted yet"
    split = split_window([w(0, 6.3, 0.2, 5.4), w(1, 6.3, 0.3, 0.0), w(2, 6.3, 0.2, 5.4)],
                         stall=5.0)
    meter.window(split, [6.3])
    meter.window(split, [6.3])
    meter.checkpoint(1.5)
    assert meter.badput["stall"] == 10.0 and meter.badput["checkpoint_save"] == 1.5
    assert meter.badput["data_wait"] == pytest.approx(0.6) and split.data_wait == 0.3
    assert meter.badput["straggler_wait"] == pytest.approx(2 * split.straggler_wait)
    # own work less the stall: rank 1 1.0 s, the others 0.7 s
    assert split.straggler_wait == pytest.approx(0.3, abs=1e-12)
    same = GoodputMeter(process_start=0.0)
    same.restart_from(step=30, last_progress=10.0)
    same.restore(step=30, seconds=0.0)  # a failure right after a save: nothing made twice
    same.first_step(now=10.0)
    same.window(split, [1.0])
    assert same.badput["recompute"] == 0.0 and same.badput["restart"] == 0.0
