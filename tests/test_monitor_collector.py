"""The collector turns the ranks' state into catalogued metric families, per scrape."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fsdpmon import catalog
from fsdpmon.monitor.collector import JobStateCollector, build_families
from fsdpmon.monitor.heartbeat import process_state
from fsdpmon.monitor.state import Heartbeat, RankState, RankStateWriter

NOW = 1_800_000_000.0
BUCKETS = len(catalog.get("fsdpmon_train_step_duration_seconds").buckets)


def _state(rank: int, last_step: float, threshold: float = 10.0, stalled: float = 0.0,
           **extra) -> RankState:
    snapshot = {
        "pid": 1, "rank": rank, "local_rank": rank, "job_name": "j", "started_unix": NOW - 100,
        "info": {"model": "tiny", "world_size": 2, "nodes": 1, "dtype": "float32",
                 "torch_version": "2.x", "node": "n", "device": "cpu"},
        "values": {"fsdpmon_train_loss": 2.5, "fsdpmon_monitor_internal_errors_total": 0},
        "phase_totals": {"data": 1.5}, "phase_means": {"data": 0.01},
        "histogram": {"counts": [1] * (BUCKETS + 1), "sum": 3.0},
        **extra,
    }
    return RankState(rank, snapshot, Heartbeat(1, last_step, 7, 7, 700, stalled, threshold))


def _exposition(states) -> str:
    registry = CollectorRegistry(auto_describe=False)

    class Fixed:
        def collect(self):
            return build_families(states, NOW)

    registry.register(Fixed())
    return generate_latest(registry).decode()


def _values(text: str, name: str) -> dict[str, float]:
    return {s.labels.get("rank", ""): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}


def test_exposition_passes_promtool(tmp_path):
    job = {"fsdpmon_job_slowest_rank": 1, "fsdpmon_job_loss_max": 2.5}
    text = _exposition([_state(0, NOW - 1, job=job), _state(1, NOW - 2)])
    path = tmp_path / "m.txt"
    path.write_text(text)
    with open(path) as fh:
        result = subprocess.run(["promtool", "check", "metrics"], stdin=fh,
                                capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _values(text, "fsdpmon_job_slowest_rank") == {"": 1.0}
    assert _values(text, "fsdpmon_train_steps_total") == {"0": 7.0, "1": 7.0}
    assert _values(text, "fsdpmon_train_step_duration_seconds_count") == {"0": BUCKETS + 1,
                                                                        "1": BUCKETS + 1}
    assert 'phase="data"' in text


def test_heartbeat_age_and_stall_are_computed_at_scrape_time():
    # Rank 1's own watchdog is frozen (stalled flag 0) but its heartbeat is 30 s old.
    text = _exposition([_state(0, NOW - 1), _state(1, NOW - 30)])
    assert _values(text, "fsdpmon_train_heartbeat_age_seconds") == {"0": 1.0, "1": 30.0}
    assert _values(text, "fsdpmon_train_stalled") == {"0": 0.0, "1": 1.0}
    # The watchdog's own flag is honoured as well.
    text = _exposition([_state(0, NOW - 1, stalled=1.0)])
    assert _values(text, "fsdpmon_train_stalled") == {"0": 1.0}


def test_a_rank_whose_watchdog_went_silent_is_unresponsive():
    waiting = _state(0, NOW - 30, stalled=1.0)  # blocked in a collective; its thread ticks
    waiting = RankState(0, waiting.snapshot, Heartbeat(1, NOW - 30, 7, 7, 700, 1.0, 10.0,
                                                       watchdog_unix=NOW - 0.5))
    frozen = _state(1, NOW - 30)
    frozen = RankState(1, frozen.snapshot, Heartbeat(1, NOW - 30, 7, 7, 700, 0.0, 10.0,
                                                     watchdog_unix=NOW - 29))
    text = _exposition([waiting, frozen])
    assert _values(text, "fsdpmon_train_unresponsive") == {"0": 0.0, "1": 1.0}
    assert _values(text, "fsdpmon_train_stalled") == {"0": 1.0, "1": 1.0}


def test_a_watchdog_that_never_ticked_counts_from_the_monitors_start():
    """A rank that hung (GIL held) before its watchdog's first tick: silent since its start."""
    for started, expected in ((NOW - 100, 1.0), (NOW - 2, 0.0)):
        state = _state(0, 0.0, started_unix=started)
        assert state.heartbeat.watchdog_unix == 0.0
        text = _exposition([state])
        assert _values(text, "fsdpmon_train_unresponsive") == {"0": expected}, started


def test_a_stopped_process_is_unresponsive_at_once():
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(sleeper.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while process_state(sleeper.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        ticking = _state(0, NOW - 1)  # its watchdog ticked a moment ago
        ticking = RankState(0, ticking.snapshot, Heartbeat(sleeper.pid, NOW - 1, 7, 7, 700,
                                                           0.0, 10.0, watchdog_unix=NOW - 0.5))
        assert _values(_exposition([ticking]), "fsdpmon_train_unresponsive") == {"0": 1.0}
        os.kill(sleeper.pid, signal.SIGCONT)
        while process_state(sleeper.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _values(_exposition([ticking]), "fsdpmon_train_unresponsive") == {"0": 0.0}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_before_the_first_step_age_counts_from_start_and_no_timestamp_is_invented():
    text = _exposition([_state(0, 0.0, threshold=10.0)])
    assert _values(text, "fsdpmon_train_heartbeat_age_seconds") == {"0": 100.0}
    assert "fsdpmon_train_last_step_timestamp_seconds" not in text
    assert _values(text, "fsdpmon_train_stalled") == {"0": 0.0}  # set-up is not a stall


def test_untrusted_snapshot_content_is_ignored_not_fatal():
    state = _state(0, NOW - 1)
    state.snapshot["values"].update({"evil_metric": 1, "fsdpmon_train_loss": "NaN-ish",
                                     "fsdpmon_train_grad_norm": [1]})
    state.snapshot["histogram"] = {"counts": [1, 2], "sum": "x"}
    state.snapshot["info"] = None
    text = _exposition([state])
    assert "evil_metric" not in text
    assert "fsdpmon_train_loss" not in text and "fsdpmon_train_grad_norm" not in text
    assert "fsdpmon_train_step_duration_seconds" not in text
    assert _values(text, "fsdpmon_train_steps_total") == {"0": 7.0}


def test_mfu_is_absent_unless_published():
    assert "fsdpmon_train_mfu_ratio" not in _exposition([_state(0, NOW)])


def test_collector_reads_live_state_files(tmp_path):
    writer = RankStateWriter(tmp_path, 0)
    writer.snapshot({"pid": os.getpid(), "rank": 0, "local_rank": 0, "job_name": "j",
                     "values": {"fsdpmon_train_loss": 1.25}})
    writer.heartbeat(NOW, 3, 3, 30, 0, 60)
    families = list(JobStateCollector(tmp_path, clock=lambda: NOW + 5).collect())
    by_name = {f.name: f for f in families}
    assert by_name["fsdpmon_train_loss"].samples[0].value == 1.25
    assert by_name["fsdpmon_train_heartbeat_age_seconds"].samples[0].value == 5.0
    writer.close()
    assert list(JobStateCollector(tmp_path).collect()) == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(
    st.sampled_from(["job_name", "local_rank", "info", "values", "phase_totals", "phase_means",
                     "histogram", "job", "started_unix", "other"]), json_values, max_size=8))
def test_any_snapshot_content_yields_a_valid_exposition(snapshot):
    state = RankState(0, snapshot, Heartbeat(1, NOW - 1, 1, 1, 1, 0, 5))
    text = _exposition([state])  # never raises, whatever a state file holds
    families = list(text_string_to_metric_families(text))
    assert any(f.name == "fsdpmon_train_steps" for f in families)
