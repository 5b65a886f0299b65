"""The straggler line, decided once: a score (the others' median busy time over a rank's own,
or the others' median held time over its own) below STRAGGLER_SCORE_THRESHOLD means the others
wait for that rank. The engine's observations, the goodput split and the rows' SLOWEST mark ask
here rather than compare the threshold themselves (the monitor publishes the score it
computes; the judge says what it means).
"""

from __future__ import annotations

import math

from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD


def below_line(score: float | None) -> bool:
    """Whether a score says the others wait for the rank (no score, or NaN: no)."""
    return score is not None and math.isfinite(score) and score < STRAGGLER_SCORE_THRESHOLD
