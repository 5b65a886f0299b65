"""The straggler verdict: each rank's score, and a flag that holds only on persistent evidence.

Pure (no clock, no I/O): the monitor feeds it one score per log window with the step number.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD


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
    """Flips (on or off) only when two busy-time medians over DISJOINT steps agree.

    One window's score rests on one median of ``span`` steps (BUSY_MIN_STEPS). On a healthy
    2-rank job on a loaded 2-core host, 2 of 166 such independent medians scored a rank below
    the line (bench_faults, 31-step windows): a per-window flag would page about once every
    150 s. Asking a second, disjoint median to agree squares that rate (about 1e-4 a window,
    if the medians are independent, which disjoint steps make them as far as the scheduler's
    noise goes). It also keeps a true straggler whose score wavers around the line from
    blinking off in one window. The price: the flag lags the score by ``span`` steps.
    """

    span: int
    flagged: bool = False
    _since: int | None = None  # step of the first window that disagreed with ``flagged``

    def update(self, score: float | None, step: int) -> bool:
        if score is None or not math.isfinite(score):
            # No verdict without a score (warm-up, a failed gather): evidence starts over.
            self.flagged, self._since = False, None
            return False
        below = score < STRAGGLER_SCORE_THRESHOLD
        if below == self.flagged:
            self._since = None
        elif self._since is None:
            self._since = step
        if self._since is not None and step - self._since >= self.span:
            self.flagged, self._since = below, None
        return self.flagged
