"""training_unstable (issue 51): the job's grad norm above UNSTABLE_GRAD_NORM_FACTOR x its recent
level (the loss spike's: the median of the LOSS_SPIKE_BASELINE_SECONDS before the window)
through the whole evidence window. A healthy curve (warm-up, decay, noise) names nothing; a case
on each side of the factor, of the window's length and of the recent level's length; during a
loss spike the norm is the spike's evidence, not a finding of its own."""

from __future__ import annotations

import dataclasses
import math
import random

from top_snapshots import REFRESH_S, diagnosis_history

from fsdpmon.conventions import (
    DIAGNOSIS_EVIDENCE_SECONDS,
    LOSS_SPIKE_BASELINE_SECONDS,
    UNSTABLE_GRAD_NORM_FACTOR,
    Severity,
)
from fsdpmon.diagnose import Finding, diagnose
from fsdpmon.job.snapshot import JobSnapshot

WINDOW = int(DIAGNOSIS_EVIDENCE_SECONDS // REFRESH_S)  # refreshes in the window, after its first
BASELINE = int(LOSS_SPIKE_BASELINE_SECONDS // REFRESH_S)  # refreshes of the recent level
N = BASELINE + 2 * WINDOW + 20  # more history than the recent level reaches back
START = N - 1 - WINDOW  # the window's first refresh (the judge compares the ones after it)
EDGE = START - BASELINE  # the oldest refresh of the recent level


def curve(norms: list[float | None], loss: list[float] | None = None,
          own: dict[int, float] | None = None) -> list[JobSnapshot]:
    """A healthy 4-rank job whose ranks report the grad norm ``norms`` per refresh (rank r
    ``own[r]`` instead where given: a stale value), the loss ``loss`` (else a flat 2)."""
    loss, own = loss or [2.0] * len(norms), own or {}
    snaps = diagnosis_history(lambda i: {}, len(norms))
    return [dataclasses.replace(s, loss=lo, ranks=[dataclasses.replace(
        r, loss=lo, grad_norm=own.get(r.rank, g), step=10 * i) for r in s.ranks])
        for i, (s, g, lo) in enumerate(zip(snaps, norms, loss, strict=True))]


def quality(snaps: list[JobSnapshot]) -> list[Finding]:
    found = diagnose(snaps)
    assert {f.cause for f in found} <= {"training_unstable", "loss_spike"}, found
    return found


def held(level: float, high: float, since: int = START + 1) -> list[float | None]:
    """``level`` before refresh ``since``, ``high`` from it on."""
    return [level] * since + [high] * (N - since)


def test_the_issue_s_norm_held_high_is_named_for_the_job():
    """0.9 before, 7-19 after (the issue's patched logits), the loss still level."""
    rng = random.Random(0)
    norms = [0.9 * rng.uniform(0.9, 1.1) for _ in range(START + 1)]
    norms += [rng.uniform(7.0, 19.0) for _ in range(N - START - 1)]
    [f] = quality(curve(norms))
    assert (f.cause, f.severity, f.rank) == ("training_unstable", Severity.WARNING, None), f
    low = float(f.summary.split()[2].rstrip("+"))  # "grad norm 10.5+ vs 0.907 before: ..."
    assert low >= 7.0 and f.summary.endswith("before: training is unstable"), f
    assert f"above {UNSTABLE_GRAD_NORM_FACTOR:g}× its median of the " in f.evidence[0], f
    assert f.to_dict()["next_step"].startswith("the grad norm jumped"), f


def test_a_healthy_norm_through_warm_up_and_decay_names_nothing():
    """High and falling through warm-up, then rising gently as the learning rate decays, with
    ±25% noise: judged at every third refresh, from one window in."""
    rng = random.Random(2)
    norms = [(0.8 + 6.0 * math.exp(-i / 15) + 0.004 * i) * rng.uniform(0.75, 1.25)
             for i in range(N)]
    snaps = curve(norms)
    for end in range(WINDOW + 2, N + 1, 3):
        assert quality(snaps[:end]) == [], end


def test_the_line_is_above_the_factor_times_the_recent_level():
    assert quality(curve(held(1.0, UNSTABLE_GRAD_NORM_FACTOR))) == [], "exactly on the line"
    [f] = quality(curve(held(1.0, UNSTABLE_GRAD_NORM_FACTOR * 1.01)))
    assert f.cause == "training_unstable", f


def test_the_norm_must_stay_above_through_the_whole_window():
    """High from the window's first compared refresh: named; from one refresh later (one
    calm value inside the window): not."""
    high = 2 * UNSTABLE_GRAD_NORM_FACTOR
    [f] = quality(curve(held(1.0, high, since=START + 1)))
    assert f.cause == "training_unstable", f
    assert quality(curve(held(1.0, high, since=START + 2))) == [], "one calm value inside"


def test_the_recent_level_reaches_back_exactly_its_length():
    """Two high norms and two calm ones before the window: both high ones inside the recent
    level make its median high (no finding); the older one a refresh before EDGE leaves the
    median calm (named)."""
    def norms(high_from: int) -> list[float | None]:
        v: list[float | None] = [None] * N
        v[high_from] = v[high_from + 1] = 10.0
        v[START - 2] = v[START - 1] = 1.0
        v[START:] = [4.0] * (N - START)
        return v

    assert quality(curve(norms(EDGE))) == [], "both high norms within the recent level"
    [f] = quality(curve(norms(EDGE - 1)))
    assert f.cause == "training_unstable" and "vs 1 before" in f.summary, f


def test_the_job_norm_is_the_ranks_median_and_a_nan_is_no_level():
    """One rank's stale value does not move the job's norm; a non-finite one is the NaN
    rules' evidence, not instability."""
    assert quality(curve(held(1.0, 5.0), own={3: 1.0})) != []
    assert quality(curve(held(1.0, 1.0), own={3: 50.0})) == []
    assert quality(curve([*held(1.0, 5.0)[:-1], math.nan])) == []


def test_during_a_loss_spike_the_norm_is_the_spike_s_evidence():
    loss = [2.0] * (START + 1) + [8.0] * (N - START - 1)
    [f] = quality(curve(held(1.0, 10.0), loss=loss))
    assert f.cause == "loss_spike" and "grad norm 10–10 for 10s" in f.evidence[-1], f
