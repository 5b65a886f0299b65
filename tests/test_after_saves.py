"""Slow saves after the fact (fsdpmon/diagnose/after.py's slow_saves, which `incidents` asks
from the files and from Prometheus): what a slow save lost is measured against the fastest
healthy save, and a run whose every save was slow still has its incident.

Found by tests/test_doors_agree.py on the recorded `checkpoint-slow` (rank 1's every save 4 s
longer, from the first): the live judge named checkpoint_slow rank 1, and both incident doors
nothing, since each save lost "nothing" beyond the fastest, itself slow.
"""

from __future__ import annotations

import pytest

from fsdpmon.conventions import CHECKPOINT_SHARE_LIMIT, INCIDENT_MIN_LOST_SECONDS
from fsdpmon.diagnose.after import slow_saves

SLOW = 2 * CHECKPOINT_SHARE_LIMIT  # a share of the time since the previous save over the limit


def save(step: int, seconds: float, rank: int = 1) -> dict:
    return {"step": step, "seconds": seconds, "rank": rank}


@pytest.mark.parametrize("seconds, named", [
    (INCIDENT_MIN_LOST_SECONDS, True), (INCIDENT_MIN_LOST_SECONDS - 0.01, False)])
def test_every_save_slow_from_the_first_loses_its_whole_time(seconds, named):
    found = slow_saves([(save(20, seconds), SLOW)])
    if named:
        ((judged, group, lost),) = found
        assert (judged.cause, judged.rank, len(group)) == ("checkpoint_slow", 1, 1)
        assert lost == pytest.approx(seconds)
    else:
        assert found == []


def test_a_healthy_save_is_the_measure_of_the_slow_ones():
    healthy = (save(20, 0.5, rank=0), CHECKPOINT_SHARE_LIMIT)  # at the limit: healthy
    ((_, _, lost),) = slow_saves([healthy, (save(40, 4.5), SLOW)])
    assert lost == pytest.approx(4.0)
