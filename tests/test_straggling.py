"""The monitor's straggler flag: it changes state only when the evidence has held over two
busy-time medians over disjoint steps AND the diagnosis evidence time
(fsdpmon.monitor.straggling), so one noisy window, or a few noisy seconds of fast steps, never
flags a healthy rank, and a true straggler's score wavering around the line does not make the
flag blink."""

from __future__ import annotations

import math

import pytest

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS as EVIDENCE_S
from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD as LINE
from fsdpmon.monitor.stats import BUSY_MIN_STEPS
from fsdpmon.monitor.straggling import StragglingFlag

LOW, HIGH = LINE * 0.8, LINE * 1.3
SLOW_STEP_S = EVIDENCE_S  # one step per evidence time: the step span is the longer bound


def flags(scores: list[float | None], every: int, step_s: float = SLOW_STEP_S) -> list[bool]:
    """The flag after each window; windows end at steps every, 2*every, ..., each step
    ``step_s`` long."""
    flag = StragglingFlag(span=BUSY_MIN_STEPS)
    return [flag.update(s, every * (i + 1), every * (i + 1) * step_s)
            for i, s in enumerate(scores)]


def first_flag_step(scores: list[float | None], every: int, step_s: float) -> int | None:
    out = flags(scores, every, step_s)
    return every * (out.index(True) + 1) if True in out else None


@pytest.mark.parametrize("every", [1, 2, 10, BUSY_MIN_STEPS, 50])
def test_one_low_window_among_healthy_ones_never_flags(every):
    for at in range(6):
        scores = [HIGH] * 12
        scores[at] = LOW
        assert flags(scores, every) == [False] * 12, f"one low window at {at}, every {every}"


@pytest.mark.parametrize("every", [1, 2, 10, BUSY_MIN_STEPS, 50])
def test_with_slow_steps_the_flag_rises_once_a_disjoint_median_agrees(every):
    # Low from the first window (step `every`): the median of a window ending BUSY_MIN_STEPS
    # steps later shares no step with it; the first window at or past that raises the flag.
    first = every
    expected = first + math.ceil(BUSY_MIN_STEPS / every) * every
    got = first_flag_step([LOW] * 40, every, SLOW_STEP_S)
    assert got == expected, f"flag at step {got}, expected {expected} (every {every})"
    assert got - first >= BUSY_MIN_STEPS, f"only {got - first} steps of evidence"


@pytest.mark.parametrize("every", [1, 2, 10])
def test_with_fast_steps_the_flag_waits_the_evidence_time(every):
    """51 ms steps (the tiny 2-rank CPU job): two disjoint 31-step medians span 1.6 s, and a
    rank slower for 2-3 s flagged a healthy run; the flag now waits EVIDENCE_S as well."""
    step_s = 0.051
    noise = [LOW] * math.ceil(3.0 / step_s / every) + [HIGH] * 400
    assert not any(flags(noise, every, step_s)), "3 s of low scores raised the flag"
    got = first_flag_step([LOW] * 1000, every, step_s)
    steps_needed = math.ceil(EVIDENCE_S / step_s / every) * every
    assert got is not None and got - every >= steps_needed > BUSY_MIN_STEPS, (
        f"flag at step {got}: {got - every if got else None} steps after the first low "
        f"window, {steps_needed} steps are {EVIDENCE_S:g} s")
    assert got - every - steps_needed < every, f"{got - every - steps_needed} steps late"


def test_a_straggler_wavering_around_the_line_stays_flagged_then_clears_the_same_way():
    every = 10
    scores = [LOW] * 5 + [HIGH] + [LOW] * 3 + [HIGH] * 8
    out = flags(scores, every)
    assert out[4] and out[5] and out[8], f"one window above the line cleared it: {out}"
    # above the line from window 9 (step 100): cleared at the first window >= 31 steps on
    cleared = out.index(False, 5) + 1
    assert cleared * every == 100 + 40, f"cleared at step {cleared * every}: {out}"


def test_no_score_means_no_flag_and_evidence_starts_over():
    every = 10
    out = flags([LOW] * 5 + [None] + [LOW] * 3, every)
    assert out[:5] == [False, False, False, False, True], out
    assert out[5:] == [False] * 4, f"the flag outlived a window without a score: {out}"
    assert flags([LOW, math.nan, LOW, LOW, LOW], every) == [False] * 5


def test_a_score_on_the_line_is_no_straggler():
    assert flags([LINE] * 10, 10) == [False] * 10


def test_the_flag_turns_when_both_bounds_are_met_and_not_before():
    """``span`` steps AND ``min_seconds`` since the first disagreeing window, each met exactly."""
    timed = StragglingFlag(span=1, min_seconds=2.0)
    assert not timed.update(LOW, 1, 10.0)  # the evidence starts
    assert not timed.update(LOW, 2, 11.5)  # a step past the span, 1.5 s of 2
    assert timed.update(LOW, 3, 12.0)  # exactly 2 s
    counted = StragglingFlag(span=4, min_seconds=0.0)
    assert not counted.update(LOW, 10, 0.0)
    assert not counted.update(LOW, 13, 1.0)  # 3 steps of 4
    assert counted.update(LOW, 14, 2.0)  # exactly 4


def test_the_busy_median_spans_an_odd_number_of_steps():
    """A true middle step: an even count would average two steps (stats.BUSY_MIN_STEPS)."""
    assert BUSY_MIN_STEPS % 2 == 1 and BUSY_MIN_STEPS > 1, BUSY_MIN_STEPS
