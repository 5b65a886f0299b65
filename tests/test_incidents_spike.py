"""A spike over before anyone looks is an incident (issue 51): `fsdpmon incidents` lists it from
the ranks' JSONL and from Prometheus history, with the rank and step it began on and its size,
by replaying the one judge (fsdpmon.diagnose.replay.quality_spans), never a rule of its own.

The run: two ranks, a step a second, the loss falling from 6 to 1.8; from step SPIKE rank 1's
own loss (its logits scaled up) is 4x, rank 0's a step later, for HELD steps, then back.
"""

from __future__ import annotations

import math
import re

import pytest
from test_incidents_history_judge import RangeAPI, _judge
from test_incidents_units import found, life, run_of, run_rec

from fsdpmon import catalog
from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS
from fsdpmon.diagnose.replay import may_worsen
from fsdpmon.job.snapshot import JobSnapshot, RankRow

T0, STEPS, SPIKE, HELD = 100.0, 300, 200, 30


def loss(rank: int, n: int, spike: float) -> float:
    """The falling curve; ``spike`` x it on the spike's steps (rank 0 from a step later)."""
    base = 1.8 + 4.2 * math.exp(-n / 40)
    return base * spike if SPIKE + (rank == 0) <= n < SPIKE + HELD else base


def norm(n: int, spike: float, after: int = 0) -> float:
    """A healthy norm, falling through warm-up and then rising gently; ``spike`` x it on the
    spike's steps and for ``after`` steps more (the norm a spike leaves high)."""
    base = 0.9 + 2.0 * math.exp(-n / 20) + 0.001 * n
    return base * spike if SPIKE <= n < SPIKE + HELD + after else base


def figures(loss_x: float, norm_x: float,
            after: int = 0) -> dict[int, list[tuple[float, float, float]]]:
    """rank -> (time, loss, grad norm) per step."""
    return {r: [(T0 + n, loss(r, n, loss_x), norm(n, norm_x, after)) for n in range(STEPS)]
            for r in (0, 1)}


def from_files(loss_x: float, norm_x: float, after: int = 0):
    runs = {r: run_rec(r) for r in (0, 1)}
    steps = {r: [{"kind": "step", "time": t, "rank": r, "step": n, "loss": lo, "grad_norm": g,
                  "step_seconds": 1.0, "window_seconds": 1.0, "data_seconds": 0.0,
                  "wait_seconds": 0.0, "steps": 1}
                 for n, (t, lo, g) in enumerate(rows)]
             for r, rows in figures(loss_x, norm_x, after).items()}
    return found(run_of(life(0, runs, steps)))


def from_prometheus(loss_x: float, norm_x: float, after: int = 0):
    api = RangeAPI()
    for r, rows in figures(loss_x, norm_x, after).items():
        api.add(catalog.TRAIN_STEP, r, [(t, float(n)) for n, (t, _, _) in enumerate(rows)])
        api.add(catalog.TRAIN_LOSS, r, [(t, lo) for t, lo, _ in rows])
        api.add(catalog.TRAIN_GRAD_NORM, r, [(t, g) for t, _, g in rows])
    judge = _judge(api)
    judge.h.end = T0 + STEPS
    return judge.incidents()


DOORS = {"files": from_files, "prometheus": from_prometheus}


@pytest.mark.parametrize("door", DOORS)
def test_a_spike_over_before_anyone_looks_is_an_incident_with_its_rank_step_and_size(door):
    [inc] = DOORS[door](4.0, 10.0)
    assert (inc.cause, inc.rank, inc.lost_gpu_seconds) == ("loss_spike", 1, 0.0), inc
    # named once its window was all above the line, until the spike's last step
    assert T0 + SPIKE - DIAGNOSIS_EVIDENCE_SECONDS <= inc.start <= T0 + SPIKE, inc
    assert inc.end == T0 + SPIKE + HELD - 1, inc
    text = "\n".join(inc.evidence)
    assert f"rank 1 at step {SPIKE}, before the others" in text, text
    # the size: the level before (the median of the falling curve as far back as the judge's
    # history reaches), and the job loss's peak once both ranks were up, at a step after it
    before = float(re.search(r"vs ([\d.]+) before", inc.evidence[0]).group(1))
    assert loss(0, SPIKE - 1, 1.0) <= before <= 1.1 * loss(0, SPIKE - 1, 1.0), text
    assert f"the job's loss peaked at {4 * loss(0, SPIKE + 1, 1.0):.3g} at step {SPIKE + 1}" \
        in text, text
    assert "grad norm" in text, "the norm's rise is the spike's evidence, not an incident"


@pytest.mark.parametrize("door", DOORS)
def test_the_norm_a_spike_leaves_high_is_named_after_it_as_the_live_judge_names_it(door):
    """The loss back on its curve, the norm held 10x for AFTER steps more (a CI run's x1000
    logits did so): the spike's incident, then training_unstable from where the loss came
    back, the job's (no rank): what `top` said at each moment, no more, no less."""
    after = 20
    spike, unstable = DOORS[door](4.0, 10.0, after)
    assert (spike.cause, spike.rank, unstable.cause, unstable.rank) == (
        "loss_spike", 1, "training_unstable", None), (spike, unstable)
    assert spike.end < unstable.end == T0 + SPIKE + HELD + after - 1, (spike.end, unstable.end)


@pytest.mark.parametrize("door", DOORS)
def test_a_grad_norm_held_high_without_a_spike_is_training_unstable(door):
    [inc] = DOORS[door](1.0, 5.0)
    assert (inc.cause, inc.rank) == ("training_unstable", None), inc
    assert inc.end == T0 + SPIKE + HELD - 1, inc
    last = SPIKE + HELD - 1  # the healthy norm rises gently: its peak is the spike's last step
    assert f"the job's grad norm peaked at {norm(last, 5.0):.3g} at step {last}" in \
        inc.evidence, inc.evidence


@pytest.mark.parametrize("door", DOORS)
def test_the_healthy_twin_and_a_spike_under_the_factor_are_no_incident(door):
    assert DOORS[door](1.0, 1.0) == []
    assert DOORS[door](1.5, 2.0) == []  # under both factors (2 and 3 x the level)


def snap(t: float, loss_: float | None, norm_: float | None) -> JobSnapshot:
    return JobSnapshot(time=t, source="t", loss=loss_,
                       ranks=(RankRow(rank=0, grad_norm=norm_),))


def test_the_replay_asks_the_judge_only_above_a_factor_of_the_lowest_before():
    """may_worsen spares the judge: a loss at exactly 2x the lowest before it, or a norm at
    exactly 3x, cannot end a window above the line; just above, it is asked."""
    ask = may_worsen()
    assert [ask(snap(t, lo, g)) for t, lo, g in [
        (0, 1.0, 1.0), (1, 2.0, 3.0), (2, 0.9, 0.9), (3, 1.81, 2.7), (4, 1.8, 2.71),
        (5, None, math.nan)]] == [False, False, False, True, True, False]
