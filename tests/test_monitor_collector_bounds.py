"""The pod endpoint's per-rank judgements at their boundaries (fsdpmon/monitor/collector.py):
stalled past the threshold and not at it, unresponsive past UNRESPONSIVE_AFTER_SECONDS and not
at it, the progress evidence only once published, the step histogram only when well formed.
Each case is one side of one comparison, so a changed comparison or constant fails here."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_monitor_collector import BUCKETS, NOW, _exposition, _state, _values

from fsdpmon import catalog
from fsdpmon.conventions import PROGRESS_PHASES, UNRESPONSIVE_AFTER_SECONDS
from fsdpmon.monitor.state import RankState


def _with(state: RankState, **heartbeat) -> RankState:
    return RankState(state.rank, state.snapshot, dataclasses.replace(state.heartbeat, **heartbeat))


@pytest.mark.parametrize(("age", "stalled"), [(10.0, 0.0), (10.5, 1.0)])
def test_a_rank_is_stalled_past_its_threshold_not_at_it(age, stalled):
    text = _exposition([_state(0, NOW - age, threshold=10.0)])
    assert _values(text, catalog.TRAIN_STALLED.name) == {"0": stalled}, (age, text)
    assert _values(text, catalog.TRAIN_STALL_THRESHOLD_SECONDS.name) == {"0": 10.0}


@pytest.mark.parametrize(("threshold", "stalled", "served"), [
    (0.0, 0.0, {}),              # no threshold yet (no median step): never overdue, not served
    (0.5, 1.0, {"0": 0.5}),      # a threshold under a second still judges
])
def test_a_threshold_is_judged_and_served_only_when_there_is_one(threshold, stalled, served):
    text = _exposition([_state(0, NOW - 30, threshold=threshold)])
    assert _values(text, catalog.TRAIN_STALLED.name) == {"0": stalled}, threshold
    assert _values(text, catalog.TRAIN_STALL_THRESHOLD_SECONDS.name) == served, threshold


def test_a_step_just_now_or_ahead_of_the_clock_has_age_zero():
    for last in (NOW, NOW + 5):
        text = _exposition([_state(0, last)])
        assert _values(text, catalog.TRAIN_HEARTBEAT_AGE_SECONDS.name) == {"0": 0.0}, last


@pytest.mark.parametrize(("silent", "unresponsive"), [
    (UNRESPONSIVE_AFTER_SECONDS, 0.0), (UNRESPONSIVE_AFTER_SECONDS + 0.5, 1.0)])
def test_unresponsive_past_the_bound_not_at_it(silent, unresponsive):
    state = _with(_state(0, NOW - 1), watchdog_unix=NOW - silent)
    text = _exposition([state])
    assert _values(text, catalog.TRAIN_UNRESPONSIVE.name) == {"0": unresponsive}, silent


def test_info_and_the_previous_exit_are_served_as_one():
    text = _exposition([_state(0, NOW - 1, previous_exit="killed"),
                        _state(1, NOW - 1, previous_exit="not-a-way-to-end")])
    assert _values(text, catalog.TRAIN_INFO.name) == {"0": 1.0, "1": 1.0}
    exits = {(s.labels["rank"], s.labels["how"]): s.value
             for f in text_string_to_metric_families(text)
             for s in f.samples if s.name == catalog.TRAIN_PREVIOUS_EXIT.name}
    assert exits == {("0", "killed"): 1.0}, exits


def _phases(text: str) -> dict[str, float]:
    return {s.labels["phase"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == catalog.TRAIN_PHASE.name}


def test_the_first_phase_is_published_with_its_position():
    state = _with(_state(0, NOW - 1), phase=0.0, position_since_unix=NOW - 3,
                  collective_entered=42.0, collective_completed=41.0, in_collective=1.0)
    text = _exposition([state])
    assert _phases(text) == {name: float(i == 0) for i, name in enumerate(PROGRESS_PHASES)}
    assert _values(text, catalog.TRAIN_COLLECTIVE_ENTERED_SEQ.name) == {"0": 42.0}
    assert _values(text, catalog.TRAIN_COLLECTIVE_COMPLETED_SEQ.name) == {"0": 41.0}
    assert _values(text, catalog.TRAIN_IN_COLLECTIVE.name) == {"0": 1.0}
    assert _values(text, catalog.TRAIN_POSITION_SINCE_TIMESTAMP_SECONDS.name) == {"0": NOW - 3}


@pytest.mark.parametrize(("phase", "since"), [
    (-1.0, NOW - 3),                      # no phase published (an older monitor)
    (float(len(PROGRESS_PHASES)), NOW - 3),  # an index past the last phase
    (0.0, 0.0),                           # a phase but no time since (not beaten yet)
])
def test_no_position_is_served_until_the_rank_publishes_one(phase, since):
    text = _exposition([_with(_state(0, NOW - 1), phase=phase, position_since_unix=since)])
    assert _phases(text) == {}, (phase, since)
    assert _values(text, catalog.TRAIN_COLLECTIVE_ENTERED_SEQ.name) == {}, (phase, since)


def _histogram(counts, total=3.0) -> dict[str, float]:
    text = _exposition([_state(0, NOW - 1, histogram={"counts": counts, "sum": total})])
    name = catalog.TRAIN_STEP_DURATION_SECONDS.name
    return {k: v for k, v in
            ((s.labels.get("le", s.name.rsplit("_", 1)[-1]), s.value)
             for f in text_string_to_metric_families(text)
             for s in f.samples if s.name.startswith(name))}


def test_the_histogram_is_cumulative_with_empty_buckets_counted_as_zero():
    counts = [0] * (BUCKETS + 1)
    counts[0], counts[-1] = 2, 3
    served = _histogram(counts, total=4.5)
    assert served["+Inf"] == 5.0 and served["count"] == 5.0 and served["sum"] == 4.5, served
    first = min((k for k in served if k not in ("+Inf", "count", "sum")), key=float)
    assert served[first] == 2.0, served


@pytest.mark.parametrize("counts", [
    [1] * BUCKETS,                    # one bucket short
    [1] * BUCKETS + [-1],             # a negative count
    [1] * BUCKETS + [float("nan")],   # not a number of steps
    "not a list",
])
def test_a_malformed_histogram_is_not_served(counts):
    assert _histogram(counts) == {}, counts


def test_a_histogram_without_a_sum_serves_zero():
    served = _histogram([1] * (BUCKETS + 1), total=None)
    assert served["sum"] == 0.0 and served["count"] == BUCKETS + 1, served
