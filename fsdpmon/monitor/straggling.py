"""The straggler verdict: each rank's score, and a flag that holds only on persistent evidence.

Pure (no clock, no I/O): the monitor feeds it one score per log window with the step number.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS, STRAGGLER_SCORE_THRESHOLD


def straggler_scores(busy: Sequence[float]) -> list[float | None]:
    """Per rank: median busy time of the OTHER ranks / own busy time (NVIDIA resiliency
    extension's score; below STRAGGLER_SCORE_THRESHOLD a rank straggles).

    The median leaves the rank itself out: over all ranks, with 2 ranks the median is the mean
    of the straggler and its peer, which halves the straggler's excess (a rank 2x slower would
    score only 0.75); with many ranks the two medians agree. None where a rank's own or its
    peers' figures are missing (NaN or 0, or no peers), rather than a made-up score.
    """
    scores: list[float | None] = []
    for i, own in enumerate(busy):
        others = [b for j, b in enumerate(busy) if j != i and math.isfinite(b) and b > 0]
        if not others or not math.isfinite(own) or own <= 0:
            scores.append(None)
        else:
            scores.append(statistics.median(others) / own)
    return scores


@dataclass
class StragglingFlag:
    """Flips (on or off) only when the evidence has held over ``span`` steps AND
    ``min_seconds`` of wall time: two busy-time medians over DISJOINT steps agree, and the
    verdict has stood as long as any other diagnosis verdict needs (DIAGNOSIS_EVIDENCE_SECONDS).

    One window's score rests on one median of ``span`` steps (BUSY_MIN_STEPS), and on a
    loaded host a healthy rank's median now and then falls below the line: a per-window flag
    would page on healthy jobs. Asking a second, disjoint median to agree squares that rate
    when the noise is per step. But a host's noise also comes in stretches of wall time (a
    rank slower for a few seconds, as if its vCPU ran slower), which with short steps spans
    both medians; so the verdict must also stand ``min_seconds``, as long as `fsdpmon
    diagnose` holds any evidence. On a real job (steps of seconds) the step span is the longer
    bound. Either way a true straggler whose score wavers around the line does not blink off.
    The price: the flag lags the score by max(span steps, min_seconds).
    (benchmarks/bench_faults.py and bench_diagnose.py print the healthy runs' scores and
    flags.)
    """

    span: int
    min_seconds: float = DIAGNOSIS_EVIDENCE_SECONDS
    flagged: bool = False
    _since: tuple[int, float] | None = None  # (step, time) of the first disagreeing window

    def update(self, score: float | None, step: int, now: float) -> bool:
        """``now``: a monotonic clock's seconds at this log step."""
        if score is None or not math.isfinite(score):
            # No verdict without a score (warm-up, a failed gather): evidence starts over.
            self.flagged, self._since = False, None
            return False
        below = score < STRAGGLER_SCORE_THRESHOLD
        if below == self.flagged:
            self._since = None
        elif self._since is None:
            self._since = (step, now)
        if self._since is not None and (step - self._since[0] >= self.span
                                        and now - self._since[1] >= self.min_seconds):
            self.flagged, self._since = below, None
        return self.flagged
