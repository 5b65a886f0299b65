"""The judge replayed over a run's history: what `top` and `diagnose` would have said at each
moment, and the stretches each finding held. Incidents (from Prometheus or from the run's files)
are these stretches; goodput asks the same replay whom a second of straggler time belongs to.

Pure: snapshots oldest first in (whatever reader built them), findings and spans out. The
readers only build the evidence; every cause is decided here, by the engine, as it is live.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from fsdpmon.conventions import (
    DIAGNOSIS_EVIDENCE_SECONDS,
    INCIDENT_MERGE_GAP_STEPS,
    LOSS_SPIKE_FACTOR,
    REPLAY_INTERVAL_SECONDS,
    UNSTABLE_GRAD_NORM_FACTOR,
    below_straggler_line,
)
from fsdpmon.diagnose.engine import diagnose
from fsdpmon.diagnose.findings import QUALITY_CAUSES, SLOWDOWN_CAUSES, Finding
from fsdpmon.diagnose.history import SnapshotHistory
from fsdpmon.diagnose.unstable import job_grad_norm
from fsdpmon.job.run_snapshots import step_snapshots
from fsdpmon.job.runlog import Incarnation, RunLog
from fsdpmon.job.snapshot import JobSnapshot

Timed = tuple[float, Finding]  # (the moment the judge said it, the finding)


@dataclass(frozen=True)
class Span:
    """One finding held from ``start`` (its evidence's first moment) to ``end`` (the last
    moment the judge still said it); ``finding`` as first said, ``said`` how many times."""

    start: float
    end: float
    finding: Finding
    said: int


def replay(snapshots: Sequence[JobSnapshot], span_s: float = DIAGNOSIS_EVIDENCE_SECONDS,
           judge_at: Callable[[JobSnapshot], bool] | None = None) -> list[Timed]:
    """The live judge's findings at each snapshot (at most one each REPLAY_INTERVAL_SECONDS),
    given the history before it as a live view keeps it (SnapshotHistory); ``judge_at``: the
    moments worth judging (a snapshot that cannot start or hold a finding asked for need not
    be: the history still keeps it)."""
    history = SnapshotHistory()
    out: list[Timed] = []
    last: float | None = None
    for snap in snapshots:
        if last is not None and snap.time - last < REPLAY_INTERVAL_SECONDS:
            continue
        history.push(snap)
        last = snap.time
        if judge_at is None or judge_at(snap):
            out += [(snap.time, f) for f in diagnose(history.snapshots(), (), span_s)]
    return out


def desync_replayed(snaps: Sequence[JobSnapshot]) -> Finding | None:
    """The collective desync the live judge, replayed over a stall's snapshots, named last
    (None: none): judged where two live ranks wait inside collectives, as a desync that
    hangs does."""
    said = [f for _, f in replay(snaps, judge_at=_in_collectives)
            if f.cause == "collective_desync"]
    return said[-1] if said else None


def _in_collectives(snap: JobSnapshot) -> bool:
    return sum(1 for r in snap.ranks if r.in_collective and not r.down) >= 2


def may_slow(snap: JobSnapshot) -> bool:
    """Whether a slowdown can stand at ``snap``: each needs, in every snapshot of its window,
    a live rank whose straggler or waited-for score is below the line, or a GPU's clock events
    (observe.py). A snapshot without any cannot be the last of such a window."""
    return any(g.clock_events for g in snap.gpus) or any(
        below_straggler_line(r.straggler_score) or below_straggler_line(r.waited_for_score)
        for r in snap.ranks if not r.down)


def slowdowns(timed: Iterable[Timed]) -> list[Timed]:
    """The findings that name the rank the others wait for (a straggler and its reasons): what
    goodput's straggler time and the straggler incidents are charged to."""
    return [(t, f) for t, f in timed if f.cause in SLOWDOWN_CAUSES]


def _cause_rank(f: Finding) -> tuple[str, int | None]:
    return f.cause, f.rank


def spans(timed: Iterable[Timed], gap: float, span_s: float = DIAGNOSIS_EVIDENCE_SECONDS,
          key: Callable[[Finding], Hashable] = _cause_rank) -> list[Span]:
    """Findings of one cause and rank (or other ``key``) said no more than ``gap`` apart
    merged into one span, which starts ``span_s`` before it was first said (the evidence the
    judge held by then)."""
    open_: dict[Hashable, Span] = {}
    done: list[Span] = []
    for t, f in sorted(timed, key=lambda x: x[0]):
        key_ = key(f)
        last = open_.get(key_)
        if last is not None and t - last.end <= gap:
            open_[key_] = Span(last.start, t, last.finding, last.said + 1)
            continue
        if last is not None:
            done.append(last)
        open_[key_] = Span(t - span_s, t, f, 1)
    return sorted([*done, *open_.values()], key=lambda s: (s.start, s.finding.cause))


def may_worsen() -> Callable[[JobSnapshot], bool]:
    """A replay's ``judge_at`` for the quality causes: whether the snapshot's job loss is above
    LOSS_SPIKE_FACTOR x the lowest loss before it, or its grad norm above
    UNSTABLE_GRAD_NORM_FACTOR x the lowest before it (over the snapshots it was asked about:
    all that the replay kept). Each rule compares every value of its window, this one too,
    with a median of values before the window, never below their lowest: a snapshot that
    fails both cannot end a window that holds either. Not a rule of its own: it only spares
    the judge the moments it would pass over, which on a long run are nearly all."""
    low = [math.inf, math.inf]  # (loss, grad norm)

    def judge_at(snap: JobSnapshot) -> bool:
        worse = False
        for i, (value, factor) in enumerate(((snap.loss, LOSS_SPIKE_FACTOR),
                                             (job_grad_norm(snap), UNSTABLE_GRAD_NORM_FACTOR))):
            if value is None or not math.isfinite(value):
                continue
            worse |= value > factor * low[i]
            low[i] = min(low[i], value)
        return worse
    return judge_at


def quality_spans(snaps: Sequence[JobSnapshot], gap: float) -> list[Span]:
    """The spans in which the judge replayed over ``snaps`` said a quality cause (a loss spike,
    training unstable). One per stretch of a cause: the rank a spike began on is named while
    the level before it is in view, and the stretch stays one when it no longer is."""
    timed = [(t, f) for t, f in replay(snaps, judge_at=may_worsen())
             if f.cause in QUALITY_CAUSES]
    return spans(timed, gap, key=lambda f: f.cause)


# What each quality cause is about: the figure its incident's peak is read from.
QUALITY_FIGURES: dict[str, tuple[str, Callable[[JobSnapshot], float | None]]] = {
    "loss_spike": ("loss", lambda s: s.loss),
    "training_unstable": ("grad norm", job_grad_norm),
}


def quality_evidence(span: Span, snaps: Sequence[JobSnapshot]) -> list[str]:
    """A quality span's evidence for its incident: the steps it covers with what the judge said
    when it first named it (its size: the level before and the lowest since; the rank and step
    it began on), then the figure's peak and where."""
    f = span.finding
    inside = [s for s in snaps if span.start <= s.time <= span.end]
    steps = [s.step for s in inside if s.step is not None]
    lines = [(f"steps {min(steps)}–{max(steps)}: " if steps else "") + f.summary, *f.evidence]
    name, value = QUALITY_FIGURES[f.cause]
    seen = [(v, s) for s in inside if (v := value(s)) is not None and math.isfinite(v)]
    if seen:
        peak, at = max(seen, key=lambda x: x[0])
        lines.append(f"the job's {name} peaked at {peak:.3g}"
                     + (f" at step {at.step}" if at.step is not None else ""))
    return lines


def merge_gap(times: Sequence[float]) -> float:
    """INCIDENT_MERGE_GAP_STEPS log steps (at their median spacing, or the replay's interval
    if longer): findings this far apart are one span."""
    spacing = statistics.median(b - a for a, b in itertools.pairwise(times)) if len(
        times) > 1 else 0.0
    # the replay judges at most once each REPLAY_INTERVAL_SECONDS: steps closer than that
    # are as far apart as its findings
    return INCIDENT_MERGE_GAP_STEPS * max(spacing, REPLAY_INTERVAL_SECONDS)


def run_slowdowns(run: RunLog, inc: Incarnation) -> tuple[dict[int, float], list[Span]]:
    """(log step -> its snapshot's time, the spans in which the judge replayed over the
    incarnation's log steps named a rank the others wait for); findings
    INCIDENT_MERGE_GAP_STEPS log steps apart (at their median spacing, or the replay's
    interval if longer) are one span."""
    snaps = step_snapshots(run, inc)
    gap = merge_gap([s.time for s in snaps])
    return ({s.step: s.time for s in snaps if s.step is not None},
            spans(slowdowns(replay(snaps, judge_at=may_slow)), gap))


def named_at(found: Iterable[Span], t: float) -> frozenset[int]:
    """The ranks the spans name at ``t``."""
    return frozenset(s.finding.rank for s in found
                     if s.start <= t <= s.end and s.finding.rank is not None)


def run_stragglers(run: RunLog) -> Callable[[Incarnation, int], frozenset[int]]:
    """For goodput's attribution: (incarnation, log step) -> the ranks the judge, replayed over
    that incarnation, named stragglers then (each incarnation replayed once, when first
    asked)."""
    judged: dict[int, tuple[dict[int, float], list[Span]]] = {}

    def named(inc: Incarnation, step: int) -> frozenset[int]:
        if inc.index not in judged:
            judged[inc.index] = run_slowdowns(run, inc)
        times, found = judged[inc.index]
        return named_at(found, times[step]) if step in times else frozenset()
    return named
