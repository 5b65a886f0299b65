"""The training-quality rules of the diagnosis: a non-finite loss, named where it was born, a
loss spike, named with the rank it began on (fsdpmon.diagnose.spike), and a grad norm held well
above its level (fsdpmon.diagnose.unstable), the warning that may come before either.

A NaN born in one rank's logits at step S is in that rank's loss at S, in every rank's gradient
norm at S (the gradient reduce-scatter carries it), and in every rank's loss from S+1. Each
rank's monitor serves the first step its loss and its grad norm were non-finite; within a step
the loss comes first. So the earliest (step, loss before grad norm) over the ranks is where it
was born, and "every rank at step S" is said only when every rank shares that earliest event.
"""

from __future__ import annotations

from fsdpmon.conventions import (
    LOSS_SPIKE_FACTOR,
    UNSTABLE_GRAD_NORM_FACTOR,
    Severity,
)
from fsdpmon.diagnose.findings import Finding, ranks_text, where
from fsdpmon.diagnose.observe import Observations, Places
from fsdpmon.diagnose.spike import Spike
from fsdpmon.diagnose.unstable import Unstable
from fsdpmon.job.snapshot import RankRow

_ORDER = ("loss", "grad norm")  # within a step: the loss, then the gradients


def _first(row: RankRow) -> tuple[int, int] | None:
    """(step, 0 for its loss / 1 for its grad norm) of the rank's first non-finite value."""
    events = [(step, i) for i, step in enumerate((row.loss_first_nonfinite_step,
                                                  row.grad_norm_first_nonfinite_step))
              if step is not None]
    return min(events) if events else None


def _origin(places: Places) -> tuple[list[int], tuple[int, int], list[str]] | None:
    """(the ranks of the earliest event, that event, evidence of the others), or None when no
    rank served a first step."""
    firsts = {r.rank: f for r in places.ranks.values() if (f := _first(r)) is not None}
    if not firsts:
        return None
    earliest = min(firsts.values())
    born = sorted(r for r, f in firsts.items() if f == earliest)
    later: dict[tuple[int, int], list[int]] = {}
    for rank, first in sorted(firsts.items()):
        if first != earliest:
            later.setdefault(first, []).append(rank)
    evidence = [f"then {ranks_text(ranks)} at step {step} ({_ORDER[kind]})"
                for (step, kind), ranks in sorted(later.items())]
    return born, earliest, evidence


def loss(obs: Observations, places: Places) -> list[Finding]:
    if obs.nonfinite:
        return [_nonfinite(obs, places)]
    # one event, one finding: the norm's rise during a spike is the spike's evidence
    if obs.loss_spike:
        return [_spike(obs, places, obs.loss_spike, obs.unstable)]
    if obs.unstable:
        return [_unstable(obs, obs.unstable)]
    return []


def _nonfinite(obs: Observations, places: Places) -> Finding:
    bad = sorted(obs.nonfinite)
    live = [r for r in obs.now.ranks if not r.down]
    evidence = [f"non-finite loss on {ranks_text(bad)} for {obs.seconds:.0f}s"]
    origin = _origin(places)
    if origin is None:  # a monitor that serves no first step: the ranks that show it now
        rank = bad[0] if len(bad) < len(live) else None
        return Finding("loss_nonfinite", Severity.CRITICAL,
                       f"loss is NaN/inf on {ranks_text(bad)}",
                       evidence=tuple(evidence), **where(places, rank))
    born, (step, kind), later = origin
    every = len(born) == len(places.ranks) and len(born) > 1
    who = "every rank" if every else ranks_text(born)
    summary = f"{_ORDER[kind]} became NaN/inf on {who} first, at step {step}"
    evidence.insert(0, f"first non-finite {_ORDER[kind]}: {who} at step {step}; the batch is "
                       "in the rank's JSONL (\"kind\": \"nonfinite\")")
    evidence[1:1] = later
    return Finding("loss_nonfinite", Severity.CRITICAL, summary, evidence=tuple(evidence),
                   **where(places, born[0] if len(born) == 1 else None))


def _norm_text(obs: Observations, unstable: Unstable) -> str:
    return (f"grad norm {unstable.low:.3g}–{unstable.high:.3g} for {obs.seconds:.0f}s, above "
            f"{UNSTABLE_GRAD_NORM_FACTOR:g}× its median of the {unstable.seconds:.0f}s before "
            f"({unstable.base:.3g})")


def _unstable(obs: Observations, unstable: Unstable) -> Finding:
    """The job's norm, which every rank shares (one global norm): no rank is named."""
    return Finding("training_unstable", Severity.WARNING,
                   f"grad norm {unstable.low:.3g}+ vs {unstable.base:.3g} before: training "
                   "is unstable", evidence=(_norm_text(obs, unstable),))


def _spike(obs: Observations, places: Places, spike: Spike,
           unstable: Unstable | None) -> Finding:
    """The spike, with the rank whose own loss crossed the line first when one rank did."""
    evidence = [f"job loss ≥ {spike.low:.3g} for {obs.seconds:.0f}s, median of the "
                f"{spike.seconds:.0f}s before {spike.base:.3g}"]
    one = len(spike.first) == 1 and spike.ranks > 1
    if one:
        at = f" at step {spike.step}" if spike.step is not None else ""
        evidence.insert(0, f"first above {LOSS_SPIKE_FACTOR:g}× the recent level: "
                           f"{ranks_text(spike.first)}{at}, before the others")
    elif spike.first:
        who = "every rank" if len(spike.first) == spike.ranks else ranks_text(spike.first)
        evidence.append(f"{who} rose together: no one rank first")
    if unstable is not None:
        evidence.append(_norm_text(obs, unstable))
    return Finding("loss_spike", Severity.WARNING,
                   f"loss spiked: {spike.low:.3g} vs {spike.base:.3g} before",
                   evidence=tuple(evidence), **where(places, spike.first[0] if one else None))
