"""Incidents from Prometheus history, judged from series the test writes (the e2e proof with a
real Prometheus is tests/test_e2e_goodput.py): each kind's culprit, times and lost GPU-seconds,
and each boundary with a case on either side.

The range API here answers as Prometheus answers a range query whose step is the scrape
interval: the samples of every series whose labels match the selector's equality matchers,
between start and end, values as strings, a "NaN" among them as a stale scrape would serve.
"""

from __future__ import annotations

import math
import re

import pytest

from fsdpmon import catalog
from fsdpmon.conventions import (
    CRASH_LOOP_RESTARTS,
    DIAGNOSIS_EVIDENCE_SECONDS,
    STRAGGLER_SCORE_THRESHOLD,
)
from fsdpmon.incidents.history import History, HistoryJudge

JOB, STEP = "llama-ft", 1.0  # a 1 s step: the judge's gap is 3 s
MATCHER = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
NAMES = re.compile(r'__name__=~"([^"]*)"')


class RangeAPI:
    def __init__(self) -> None:
        self.series: list[tuple[dict[str, str], list[tuple[float, float]]]] = []

    def add(self, metric: catalog.Metric, rank: int, samples: list[tuple[float, float]],
            job: str = JOB, **labels: str) -> None:
        self.series.append(({"__name__": metric.name, "job_name": job, "rank": str(rank),
                             **labels}, samples))

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict]:
        name, selector = promql.split("{", 1)
        wanted = dict(MATCHER.findall(selector), **({"__name__": name} if name else {}))
        names = NAMES.search(selector)  # {__name__=~"a|b",...}: the history reader's one query
        return [{"metric": labels, "values": [[t, str(v)] for t, v in samples
                                              if start <= t <= end]}
                for labels, samples in self.series
                if all(labels.get(k) == v for k, v in wanted.items())
                and (names is None or re.fullmatch(names.group(1), labels["__name__"]))]


def _judge(api: RangeAPI, nodes: tuple[str, ...] = ("node-a", "node-b")) -> HistoryJudge:
    for rank, node in enumerate(nodes):
        api.add(catalog.TRAIN_INFO, rank, [(90.0, 1.0)], node=node)
    return HistoryJudge(History(JOB, 0.0, 1000.0, STEP, api))


def _flag(on: range | list[float], span: range = range(100, 121)) -> list[tuple[float, float]]:
    return [(float(t), 1.0 if t in on else 0.0) for t in span]


def _stall(api: RangeAPI, on=range(110, 116)) -> None:
    api.add(catalog.TRAIN_STALLED, 0, _flag(on))
    api.add(catalog.TRAIN_STALL_THRESHOLD_SECONDS, 0, [(100.0, 3.0)])
    api.add(catalog.TRAIN_STALL_THRESHOLD_SECONDS, 1, [(100.0, 2.0)])  # the larger one leads


# ---- stalls ---------------------------------------------------------------------------------

def test_a_stall_with_one_unresponsive_rank_names_it_from_the_threshold_before():
    api = RangeAPI()
    _stall(api)
    api.add(catalog.TRAIN_UNRESPONSIVE, 1, _flag(range(111, 115)))
    (found,) = _judge(api).stalls()
    # stalled seen 110-115, 3 s after its last step: began at 107; two ranks idle 8 s each
    assert (found.cause, found.rank, found.node) == ("rank_unresponsive", 1, "node-b"), found
    assert (found.start, found.end, found.lost_gpu_seconds) == (107.0, 115.0, 16.0), found
    assert found.evidence == ("ranks [0] reported stalled from 110 to 115 (threshold 3.0 s)",
                              "rank 1 was unresponsive meanwhile (stopped, or holding the GIL)")


@pytest.mark.parametrize(("seen", "named"), [
    (106.9, None),  # before the stall, beyond the gap: not its evidence
    (107.0, 1),     # the gap (3 steps) before the first stalled sample
    (115.0, 1),     # its last stalled sample
    (115.1, None),  # after it
])
def test_unresponsive_counts_from_a_gap_before_the_stall_to_its_end(seen, named):
    api = RangeAPI()
    _stall(api)
    api.add(catalog.TRAIN_UNRESPONSIVE, 1, [(seen, 1.0)])
    (found,) = _judge(api).stalls()
    assert (found.cause, found.rank) == (
        ("rank_unresponsive", 1) if named is not None else ("hang", None)), (seen, found)


def test_a_value_below_one_is_not_a_flag():
    api = RangeAPI()
    api.add(catalog.TRAIN_STALLED, 0, [(110.0, 0.99)])
    assert _judge(api).stalls() == []
    api.add(catalog.TRAIN_UNRESPONSIVE, 1, [(111.0, 0.99)])
    _stall(api)
    assert [f.cause for f in _judge(api).stalls()] == ["hang"]


@pytest.mark.parametrize(("second", "spans"), [(113.0, 1), (113.1, 2)])
def test_stalled_samples_more_than_the_gap_apart_are_two_stalls(second, spans):
    api = RangeAPI()  # missing scrapes between the samples, not a sample that says 0
    api.add(catalog.TRAIN_STALLED, 0, [(110.0, 1.0), (second, 1.0)])
    assert len(_judge(api).stalls()) == spans, second


@pytest.mark.parametrize(("second", "spans"), [(113.0, 1), (113.1, 2)])
def test_two_ranks_stalled_within_the_gap_of_each_other_are_one_stall(second, spans):
    api = RangeAPI()
    api.add(catalog.TRAIN_STALLED, 0, [(110.0, 1.0)])
    api.add(catalog.TRAIN_STALLED, 1, [(second, 1.0)])
    assert len(_judge(api).stalls()) == spans, second


def test_stalls_overlapping_or_within_the_gap_merge_into_the_last_one_only():
    api = RangeAPI()
    api.add(catalog.TRAIN_STALLED, 2, [(100.0, 1.0), (101.0, 1.0), (120.0, 1.0), (121.0, 1.0)])
    api.add(catalog.TRAIN_STALLED, 0, [(float(t), 1.0) for t in range(110, 119)])
    api.add(catalog.TRAIN_STALLED, 1, [(111.0, 1.0), (112.0, 1.0)])  # inside rank 0's
    found = _judge(api, ("a", "b", "c")).stalls()
    # 100-101 alone; 110-118 holds 111-112, and 120-121 begins 2 s after its end
    assert [(f.start, f.end) for f in found] == [(100.0, 101.0), (110.0, 121.0)], found


def test_two_unresponsive_ranks_leave_the_culprit_to_the_progress_series():
    api = RangeAPI()
    _stall(api)
    api.add(catalog.TRAIN_STALLED, 2, _flag(range(110, 116)))
    for rank in (1, 2):
        api.add(catalog.TRAIN_UNRESPONSIVE, rank, _flag(range(111, 115)))
    (found,) = _judge(api, ("node-a", "node-b", "node-c")).stalls()
    assert (found.cause, found.rank, found.lost_gpu_seconds) == ("hang", None, 24.0), found


def test_a_hang_is_named_by_the_rank_behind_in_collectives():
    api = RangeAPI()
    _stall(api)
    api.add(catalog.TRAIN_COLLECTIVE_ENTERED_SEQ, 0, [(105.0, 41.0), (112.0, 42.0)])
    api.add(catalog.TRAIN_COLLECTIVE_ENTERED_SEQ, 1, [(105.0, 41.0), (112.0, 41.0)])
    api.add(catalog.TRAIN_IN_COLLECTIVE, 0, [(112.0, 1.0)])
    (found,) = _judge(api).stalls()
    assert (found.cause, found.rank, found.node) == ("hang", 1, "node-b"), found
    assert found.evidence[0] == "culprit: rank 1 (behind in collectives: at #41, others at #42)"


def test_a_hang_without_progress_series_names_nobody():
    api = RangeAPI()
    _stall(api)
    (found,) = _judge(api).stalls()
    assert (found.cause, found.rank, found.node) == ("hang", None, ""), found
    assert not found.evidence[0].startswith("culprit"), found.evidence


# ---- restarts -------------------------------------------------------------------------------

def _restart(api: RangeAPI, restarts: int) -> None:
    api.add(catalog.TRAIN_PREVIOUS_EXIT, 1, [(150.0, 1.0), (151.0, 1.0)], how="killed")
    api.add(catalog.TRAIN_PREVIOUS_EXIT, 0, [(150.5, 1.0)], how="sigterm")
    for rank in (0, 1):
        api.add(catalog.TRAIN_RESTARTS, rank, [(150.0, float(restarts))])
    # the last step before the kill, scraped at 145; the sample at 150 is the new incarnation
    api.add(catalog.TRAIN_LAST_STEP_TIMESTAMP_SECONDS, 0,
            [(140.0, 139.5), (145.0, 144.2), (150.0, 149.9)])


@pytest.mark.parametrize(("restarts", "cause"), [
    (CRASH_LOOP_RESTARTS - 1, "rank_missing"), (CRASH_LOOP_RESTARTS, "crash_loop")])
def test_a_restart_names_the_killed_rank_from_its_last_step_to_its_return(restarts, cause):
    api = RangeAPI()
    _restart(api, restarts)
    (found,) = _judge(api).restarts_found()
    assert (found.cause, found.rank, found.node) == (cause, 1, "node-b"), found
    assert (found.start, found.end) == (144.2, 150.0), found
    assert found.lost_gpu_seconds == pytest.approx(2 * 5.8, abs=1e-9), found  # two ranks
    assert found.evidence[0].startswith("rank 1 died without exiting"), found.evidence


def test_ranks_that_all_exited_normally_are_no_restart():
    api = RangeAPI()
    for rank in (0, 1):
        api.add(catalog.TRAIN_PREVIOUS_EXIT, rank, [(150.0, 1.0)], how="exit")
    api.add(catalog.TRAIN_PREVIOUS_EXIT, 0, [(150.0, 1.0)], how="not-a-way-of-ending")
    assert _judge(api).restarts_found() == []


# ---- stragglers -----------------------------------------------------------------------------

def _straggler(api: RangeAPI, data_ratio: float, times: range, badput_step: float,
               score: float = 0.5) -> None:
    """Rank 1 busy 1 s a step, rank 0 0.5 s (it waits the rest for rank 1): the figures the
    monitor publishes and the live judge reads (scores, busy time, data wait)."""
    for rank, busy, own_score in ((0, 0.5, 2.0), (1, 1.0, score)):
        api.add(catalog.TRAIN_STEP_TIME_SECONDS, rank, [(float(t), 1.0) for t in times])
        api.add(catalog.TRAIN_COLLECTIVE_WAIT_RATIO, rank, [(float(t), 1 - busy) for t in times])
        api.add(catalog.TRAIN_BUSY_SECONDS, rank, [(float(t), busy) for t in times])
        api.add(catalog.TRAIN_STRAGGLER_SCORE, rank, [(float(t), own_score) for t in times])
    api.add(catalog.TRAIN_DATA_WAIT_RATIO, 1, [(float(t), data_ratio) for t in times])
    api.add(catalog.TRAIN_DATA_WAIT_RATIO, 0, [(float(t), 0.0) for t in times])
    api.add(catalog.TRAIN_BADPUT_SECONDS_TOTAL, 0,
            [(float(t), badput_step * i) for i, t in enumerate(times)], cause="data_wait")


@pytest.mark.parametrize(("data_ratio", "cause"), [
    (0.5, "straggler_data"), (0.0, "straggler_compute")])
def test_a_straggler_is_named_with_its_cause_and_the_badput_meanwhile(data_ratio, cause):
    api = RangeAPI()
    _straggler(api, data_ratio, range(100, 116), 0.5)
    (found,) = _judge(api).stragglers()
    # first named at 110, with the evidence it held since 100 (DIAGNOSIS_EVIDENCE_SECONDS)
    assert (found.cause, found.rank, found.start, found.end) == (cause, 1, 100.0, 115.0), found
    # the data-wait counter rose 7.5 s over the span; two GPUs
    assert found.lost_gpu_seconds == 15.0, found


@pytest.mark.parametrize(("last", "named"), [(109, 0), (110, 1)])
def test_a_straggler_is_named_once_its_evidence_held_as_long_as_the_live_judge_needs(last, named):
    assert DIAGNOSIS_EVIDENCE_SECONDS == 10.0  # the samples below are written for it
    api = RangeAPI()
    _straggler(api, 0.5, range(100, last + 1), 0.5)
    assert len(_judge(api).stragglers()) == named, last


@pytest.mark.parametrize(("score", "named"), [(STRAGGLER_SCORE_THRESHOLD, 0),
                                              (STRAGGLER_SCORE_THRESHOLD - 0.01, 1)])
def test_the_published_score_against_the_line_decides_as_it_does_live(score, named):
    api = RangeAPI()
    _straggler(api, 0.5, range(100, 116), 0.5, score=score)
    assert len(_judge(api).stragglers()) == named, score


@pytest.mark.parametrize(("badput_step", "named"), [(0.09, 0), (0.1, 1)])
def test_a_straggler_that_cost_less_than_a_second_is_noise(badput_step, named):
    api = RangeAPI()
    _straggler(api, 0.5, range(100, 111), badput_step)  # 10 rises: 0.9 s, then 1.0 s
    assert len(_judge(api).stragglers()) == named, badput_step


def test_a_slow_save_is_no_straggler_where_the_live_judge_names_none():
    """CI (test_e2e_goodput): during rank 0's slow save, rank 1 waited for it inside a
    collective, so the last window's step time less its wait made rank 0 look busier (0.031 s
    vs 0.023 s, below the line) for a few samples, while the monitor's own busy medians and
    score stayed healthy. The live judge reads the score: no straggler, only the slow save."""
    api = RangeAPI()
    times = range(100, 121)
    for rank, wait in ((0, 0.0), (1, 0.26)):
        api.add(catalog.TRAIN_STEP_TIME_SECONDS, rank, [(float(t), 0.031) for t in times])
        api.add(catalog.TRAIN_COLLECTIVE_WAIT_RATIO, rank, [(float(t), wait) for t in times])
        api.add(catalog.TRAIN_DATA_WAIT_RATIO, rank, [(float(t), 0.0) for t in times])
        api.add(catalog.TRAIN_BUSY_SECONDS, rank, [(float(t), 0.023) for t in times])
        api.add(catalog.TRAIN_STRAGGLER_SCORE, rank, [(float(t), 1.0) for t in times])
    api.add(catalog.TRAIN_BADPUT_SECONDS_TOTAL, 0,
            [(float(t), 0.2 * i) for i, t in enumerate(times)], cause="data_wait")
    _saves(api, [(100.0, 0.5, 0.1), (110.0, 2.5, 0.4)])
    found = _judge(api).incidents()
    assert [(i.cause, i.rank) for i in found] == [("checkpoint_slow", 1)], found


# ---- checkpoints ----------------------------------------------------------------------------

def _saves(api: RangeAPI, saves: list[tuple[float, float, float]]) -> None:
    """(time, seconds, share) of rank 0's saves, each scraped twice; rank 1 the slow writer."""
    seconds, ratio, own = [], [], []
    for t, took, share in saves:
        seconds += [(t, took), (t + 1, took)]
        ratio += [(t, share), (t + 1, share)]
        own += [(t, took - 0.1)]
    api.add(catalog.TRAIN_CHECKPOINT_SECONDS, 0, seconds)
    api.add(catalog.TRAIN_CHECKPOINT_TIME_RATIO, 0, ratio)
    api.add(catalog.TRAIN_CHECKPOINT_OWN_SECONDS, 0, [(t, 0.2) for t, _, _ in saves])
    api.add(catalog.TRAIN_CHECKPOINT_OWN_SECONDS, 1, own)


def test_slow_saves_are_one_incident_named_by_the_slowest_writer():
    api = RangeAPI()
    _saves(api, [(100.0, 0.5, 0.1), (120.0, 2.5, 0.4), (140.0, 2.6, 0.2), (160.0, 0.5, 0.1)])
    (found,) = _judge(api).checkpoints()
    assert (found.cause, found.rank, found.start, found.end) == (
        "checkpoint_slow", 1, 117.5, 140.0), found
    # beyond the fastest save: 2.0 s and 2.1 s, two GPUs
    assert found.lost_gpu_seconds == pytest.approx(2 * 4.1, abs=1e-9), found
    assert found.evidence[0] == "a save took 2.5 s, 40% of the time since the previous (limit 25%)"


@pytest.mark.parametrize(("took", "named"), [(1.49, 0), (1.5, 1)])
def test_slow_saves_that_cost_less_than_a_second_are_noise(took, named):
    api = RangeAPI()
    _saves(api, [(100.0, 0.5, 0.1), (120.0, took, 0.3)])
    assert len(_judge(api).checkpoints()) == named, took


# ---- non-finite loss, and the whole ---------------------------------------------------------

@pytest.mark.parametrize(("steps", "rank"), [((57.0, 55.0), 1), ((55.0, 55.0), 0)])
def test_the_first_nonfinite_loss_is_the_earliest_step_then_the_lowest_rank(steps, rank):
    api = RangeAPI()
    for r, step in enumerate(steps):
        api.add(catalog.TRAIN_LOSS_FIRST_NONFINITE_STEP, r, [(130.0 - r, step)])
    (found,) = _judge(api).nonfinite()
    assert (found.cause, found.rank, found.start) == ("loss_nonfinite", rank, 130.0 - rank), found
    assert found.lost_gpu_seconds == 0.0, found  # the steps after it are the goodput's to judge
    assert found.evidence == (f"rank {rank}: first non-finite loss at step 55",)


def test_the_restarts_own_stall_goes_and_an_earlier_stop_stays():
    api = RangeAPI()
    _restart(api, 1)  # last step 144.2, back at 150
    # a stop seen stalled 140-145: its last stalled sample lags past the restart's last step
    api.add(catalog.TRAIN_STALLED, 0, _flag(range(140, 146), range(135, 147)))
    api.add(catalog.TRAIN_UNRESPONSIVE, 1, _flag(range(139, 144), range(135, 147)))
    # the group standing still after the kill, flagged 3 s after a step past the last seen
    api.add(catalog.TRAIN_STALLED, 1, [(148.5, 1.0), (149.0, 1.0)])
    api.add(catalog.TRAIN_STALL_THRESHOLD_SECONDS, 0, [(100.0, 3.0)])
    found = _judge(api).incidents()
    assert [(i.cause, i.rank, i.start) for i in found] == [
        ("rank_unresponsive", 1, 137.0), ("rank_missing", 1, 144.2)], found


def test_the_slow_writer_is_the_rank_with_the_most_own_time_at_the_save():
    api = RangeAPI()
    api.add(catalog.TRAIN_CHECKPOINT_SECONDS, 0, [(100.0, 0.5), (120.0, 2.5)])
    api.add(catalog.TRAIN_CHECKPOINT_TIME_RATIO, 0, [(100.0, 0.1), (120.0, 0.4)])
    api.add(catalog.TRAIN_CHECKPOINT_OWN_SECONDS, 0, [(100.0, 0.3), (120.0, 0.3)])
    api.add(catalog.TRAIN_CHECKPOINT_OWN_SECONDS, 1, [(100.0, 0.4), (120.0, 0.9)])
    api.add(catalog.TRAIN_CHECKPOINT_OWN_SECONDS, 2, [(500.0, 0.1)])  # nothing yet at 120 s
    (found,) = _judge(api, ("node-a", "node-b", "node-c")).checkpoints()
    assert found.rank == 1, found


# ---- what the judge reads, and its resolution -------------------------------------------

def test_values_that_are_not_numbers_are_skipped():
    api = RangeAPI()
    api.series.append(({"__name__": catalog.TRAIN_STALLED.name, "job_name": JOB, "rank": "0"},
                       [(110.0, "x"), (111.0, 1.0), (112.0, None)]))
    api.add(catalog.TRAIN_STALLED, 1, [(111.0, math.inf), (112.0, math.nan)])
    assert History(JOB, 0.0, 1000.0, STEP, api).series(catalog.TRAIN_STALLED) == {
        0: [(111.0, 1.0)], 1: []}


@pytest.mark.parametrize(("step", "stalls"), [(2.0, 1), (0.5, 2)])
def test_the_gap_that_splits_two_stalls_is_three_query_steps(step, stalls):
    api = RangeAPI()
    api.add(catalog.TRAIN_STALLED, 0, [(110.0, 1.0), (114.0, 1.0)])  # 4 s apart
    judge = HistoryJudge(History(JOB, 0.0, 1000.0, step, api))
    assert len(judge.stalls()) == stalls, (step, judge.gap)


@pytest.mark.parametrize(("nodes", "lost"), [((), 8.0), (("node-a",), 8.0),
                                              (("node-a", "node-b", "node-c"), 24.0)])
def test_lost_gpu_seconds_are_the_stall_times_every_rank_of_the_job(nodes, lost):
    api = RangeAPI()
    _stall(api)
    (found,) = _judge(api, nodes).stalls()  # stalled 110-115, 3 s after the last step
    assert found.lost_gpu_seconds == lost, (nodes, found)


@pytest.mark.parametrize("threshold", [None, [(112.0, 3.0)], [(100.0, 0.0)]])
def test_without_a_threshold_served_by_then_the_stall_starts_at_its_first_sample(threshold):
    api = RangeAPI()
    api.add(catalog.TRAIN_STALLED, 0, _flag(range(110, 116)))
    if threshold:
        api.add(catalog.TRAIN_STALL_THRESHOLD_SECONDS, 0, threshold)
    (found,) = _judge(api).stalls()
    assert (found.start, found.lost_gpu_seconds) == (110.0, 10.0), found


def test_the_stalled_ranks_are_those_flagged_within_the_stall():
    api = RangeAPI()
    _stall(api)  # rank 0: 110-115
    api.add(catalog.TRAIN_STALLED, 1, [(110.0, 1.0)])  # at its start
    api.add(catalog.TRAIN_STALLED, 2, [(115.0, 1.0)])  # at its end
    api.add(catalog.TRAIN_STALLED, 3, _flag([]))  # never
    (found,) = _judge(api, ("a", "b", "c", "d")).stalls()
    assert found.evidence[0] == "ranks [0, 1, 2] reported stalled from 110 to 115 (threshold " \
                                "3.0 s)", found.evidence


def test_two_ranks_behind_are_both_named_and_neither_is_the_culprit_alone():
    api = RangeAPI()
    _stall(api)
    for rank, seq in ((0, 42.0), (1, 41.0), (2, 41.0)):
        api.add(catalog.TRAIN_COLLECTIVE_ENTERED_SEQ, rank, [(112.0, seq)])
    (found,) = _judge(api, ("a", "b", "c")).stalls()
    assert (found.rank, found.evidence[0]) == (
        None, "culprit: ranks 1, 2 (behind in collectives: at #41, others at #42)"), found


def test_an_unknown_way_of_ending_is_no_evidence_of_the_restart():
    api = RangeAPI()
    _restart(api, 1)
    api.add(catalog.TRAIN_PREVIOUS_EXIT, 2, [(140.0, 1.0)], how="bogus")  # before the return
    # a last-step timestamp at the return itself is the new incarnation's
    api.add(catalog.TRAIN_LAST_STEP_TIMESTAMP_SECONDS, 1, [(149.0, 150.0)])
    (found,) = _judge(api, ("a", "b", "c")).restarts_found()
    assert (found.start, found.end) == (144.2, 150.0), found
