"""A stall's culprit from Prometheus history: the progress series as they stood at the stall's
end, judged by the diagnosis' own rule (behind in collectives, else outside one while others
wait inside), never a rank that only waits."""

from __future__ import annotations

import pytest

from fsdpmon.incidents.history import restart_stall, stall_culprits
from fsdpmon.incidents.incidents import Incident

START, END = 100.0, 160.0


def test_the_rank_behind_in_collectives_is_named_and_the_waiting_rank_is_not():
    entered = {0: [(110.0, 41.0), (150.0, 42.0)], 1: [(110.0, 41.0), (150.0, 41.0)]}
    inside = {0: [(150.0, 1.0)], 1: [(150.0, 0.0)]}
    culprits, why = stall_culprits((entered, inside), [0, 1], START, END)
    assert (culprits, why) == ([1], "behind in collectives: at #41, others at #42"), (culprits, why)


def test_the_last_sample_at_or_before_the_end_counts():
    # rank 1 caught up at 161 s, after the stall ended: at the end it was behind
    entered = {0: [(150.0, 42.0)], 1: [(150.0, 41.0), (161.0, 42.0)]}
    assert stall_culprits((entered, {}), [0, 1], START, END)[0] == [1]
    # ... and at 160 s exactly it had caught up: nobody is behind
    entered[1] = [(150.0, 41.0), (160.0, 42.0)]
    assert stall_culprits((entered, {}), [0, 1], START, END) == ([], "")


def test_samples_from_before_the_stall_are_not_its_evidence():
    # rank 1 was behind at 99 s, before the stall began, and served nothing during it
    entered = {0: [(99.0, 42.0), (150.0, 42.0)], 1: [(99.0, 41.0)]}
    assert stall_culprits((entered, {}), [0, 1], START, END) == ([], "")
    entered[1] = [(99.0, 41.0), (100.0, 41.0)]  # at the start itself: evidence
    assert stall_culprits((entered, {}), [0, 1], START, END)[0] == [1]
    # the same for the inside-a-collective flags
    entered = {0: [(150.0, 42.0)], 1: [(150.0, 42.0)]}
    inside = {0: [(150.0, 1.0)], 1: [(99.0, 0.0)]}
    assert stall_culprits((entered, inside), [0, 1], START, END) == ([], "")
    inside[1] = [(100.0, 0.0)]
    assert stall_culprits((entered, inside), [0, 1], START, END)[0] == [1]


@pytest.mark.parametrize(("flags", "named"), [
    ({0: 1.0, 1: 0.0}, [1]),       # rank 1 outside while rank 0 waits inside
    ({0: 0.0, 1: 1.0}, [0]),
    ({0: 1.0, 1: 1.0}, []),        # every rank waits alike: no culprit
    ({0: 0.0, 1: 0.0}, []),        # every rank outside alike (a host-side hang everywhere)
])
def test_outside_a_collective_while_others_wait_inside(flags, named):
    entered = {0: [(150.0, 42.0)], 1: [(150.0, 42.0)]}
    inside = {rank: [(150.0, flag)] for rank, flag in flags.items()}
    culprits, why = stall_culprits((entered, inside), [0, 1], START, END)
    assert culprits == named, (flags, culprits, why)
    assert (why == "outside a collective while 1 rank wait inside one") == bool(named), why


def test_no_progress_series_names_nobody():
    assert stall_culprits(({}, {}), [0, 1, 2], START, END) == ([], "")


def _span(cause: str, start: float, end: float) -> Incident:
    return Incident(start, end, cause, 1, "", "node-a", "", (), 0.0)


RESTART = _span("rank_missing", 100.0, 108.0)  # last step at 100 s, back at 108 s


@pytest.mark.parametrize(("start", "explained"), [
    (90.0, False),   # a stop that began before the kill: its own fault ...
    (96.9, False),   # ... up to the scrape's slack (3 s) before the restart's last step
    (97.0, True),
    (104.0, True),   # the group standing still while the agent restarts it
    (108.0, True),
    (108.1, False),  # after the group came back: a stall of the new incarnation
])
def test_a_stall_is_the_restarts_own_only_when_it_began_with_it(start, explained):
    # each ends after the restart's last step: the stalled gauge lags the resumed steps (the
    # stop in test_e2e_goodput ended 2 s before the kill and its last stalled sample came later)
    stall = _span("rank_unresponsive", start, max(start, 101.0))
    assert restart_stall(stall, [RESTART], slack=3.0) is explained, (start, explained)
    assert not restart_stall(stall, [], slack=3.0)
