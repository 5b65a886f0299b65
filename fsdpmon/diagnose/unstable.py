"""Training going unstable: the job's gradient norm, throughout the evidence window, above
UNSTABLE_GRAD_NORM_FACTOR x its recent level (issue 51: 0.9 before, 7-19 after one rank's
logits were scaled up).

The recent level is the loss spike's (spike.recent_level): the median over the
LOSS_SPIKE_BASELINE_SECONDS before the window, so that the norm's fall through warm-up and its
slow rise as the learning rate decays are the level, not a departure from it. Every value of
the window must be above the line, as for every other finding: one noisy step is not it.

The job's norm is the median of what the live ranks report: clipping computes one global norm
(every rank reduces the shards' squares), so the ranks agree, and a median ignores a rank that
reports a stale window's value.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from fsdpmon.conventions import UNSTABLE_GRAD_NORM_FACTOR
from fsdpmon.diagnose.spike import recent_level
from fsdpmon.diagnose.window import Window
from fsdpmon.job.snapshot import JobSnapshot


@dataclass(frozen=True)
class Unstable:
    base: float  # the grad norm's recent level (median before the window)
    low: float  # the lowest within the window
    high: float  # the highest within the window
    seconds: float  # how far before the window the recent level reaches (as held)


def job_grad_norm(snap: JobSnapshot) -> float | None:
    """The median of the live ranks' grad norms (a non-finite one makes it non-finite: the
    NaN rules' evidence, not a level); None when no rank reports one."""
    norms = [r.grad_norm for r in snap.ranks if not r.down and r.grad_norm is not None]
    if not norms:
        return None
    if not all(math.isfinite(v) for v in norms):
        return math.nan
    return statistics.median(norms)


def grad_norm_unstable(window: Window) -> Unstable | None:
    """The instability when every job grad norm of the window is above
    UNSTABLE_GRAD_NORM_FACTOR x their recent level."""
    level = recent_level(window, job_grad_norm)
    if level is None or level.base <= 0 or level.low <= UNSTABLE_GRAD_NORM_FACTOR * level.base:
        return None
    norms = [v for s in window.recent[1:] if (v := job_grad_norm(s)) is not None]
    return Unstable(level.base, level.low, max(norms), level.seconds)
