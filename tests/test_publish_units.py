"""What one rank publishes, in process (no server, no files; the served series from the same
snapshot are tests/test_monitor.py's and tests/test_progress.py's): the step histogram's
buckets on each side of each bound, the values a log step sets and the ones it leaves unknown,
the progress position and since when, the stall's evidence on entering and leaving, and how the
exit record is ended."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest
from support import free_port

from fsdpmon import catalog
from fsdpmon.conventions import (
    EXIT_ERROR,
    EXIT_NORMAL,
    EXIT_SIGTERM,
    PROGRESS_PHASES,
    STRAGGLER_SCORE_THRESHOLD,
)
from fsdpmon.distenv import DistEnv
from fsdpmon.monitor import collectives, exit_cleanup
from fsdpmon.monitor import publish as publish_mod
from fsdpmon.monitor.checkpoint_time import SaveTimes
from fsdpmon.monitor.config import MonitorConfig
from fsdpmon.monitor.publish import Publication
from fsdpmon.monitor.stats import WindowStats
from fsdpmon.monitor.timing import WindowTimes

BOUNDS = catalog.TRAIN_STEP_DURATION_SECONDS.buckets


def _pub(failures: list | None = None) -> Publication:
    sink = failures if failures is not None else []
    return Publication(MonitorConfig(port=0, job_name="j"), DistEnv(rank=1, local_rank=1),
                       {"model": "tiny"}, lambda where, exc: sink.append((where, exc)))


def _stats(**kw: object) -> WindowStats:
    base = dict(steps=2, tokens=64, wall_seconds=1.0, tokens_per_second=64.0, step_time_s=0.5,
                data_wait_ratio=0.1, busy_s=0.4, busy_steps=(0.4, 0.4),
                collective_wait_ratio=0.2, descheduled_ratio=None,
                phase_means={"forward": 0.2}, mfu=None)
    return WindowStats(**{**base, **kw})


def _log(pub: Publication, steps: list[float] = (), phases: dict | None = None,
         **record: object) -> dict:
    pub.log_step(_stats(), dict(record), {}, WindowTimes(list(steps), phases or {}), 0, None)
    return pub.snapshot["values"]


def _bucket_counts(seconds: list[float]) -> list[int]:
    pub = _pub()
    _log(pub, seconds)
    return pub.snapshot["histogram"]["counts"]


# ---- the step-duration histogram ----------------------------------------------------------

@pytest.mark.parametrize("i", range(len(BOUNDS)))
def test_a_step_on_a_bound_is_in_its_bucket_and_just_above_in_the_next(i):
    bound = BOUNDS[i]
    counts = _bucket_counts([bound, math.nextafter(bound, math.inf)])
    expected = [0] * (len(BOUNDS) + 1)
    expected[i] += 1
    expected[i + 1] += 1
    assert counts == expected, (bound, counts)


def test_steps_are_counted_and_summed_across_log_steps():
    pub = _pub()
    _log(pub, [0.25, 0.5])
    _log(pub, [0.75], {"forward": 0.5})
    _log(pub, [], {"forward": 0.25, "data": 0.125})
    hist = pub.snapshot["histogram"]
    assert (sum(hist["counts"]), hist["sum"]) == (3, 1.5), hist
    assert pub.snapshot["phase_totals"] == {"forward": 0.75, "data": 0.125}
    assert pub.snapshot["phase_means"] == {"forward": 0.2}


def test_a_step_longer_than_every_bound_is_in_the_last_bucket():
    assert _bucket_counts([BOUNDS[-1] * 2])[-1] == 1


# ---- the values a log step serves ---------------------------------------------------------

def test_a_log_step_serves_the_window_and_the_record():
    values = _log(_pub(), busy_s=0.4, straggler_score=0.6, straggling=True, loss=2.5,
                  loss_nonfinite=False, lr=3e-4, grad_norm=1.5, waited_for_score=0.9)
    expected = {catalog.TRAIN_TOKENS_PER_SECOND: 64.0, catalog.TRAIN_STEP_TIME_SECONDS: 0.5,
                catalog.TRAIN_DATA_WAIT_RATIO: 0.1, catalog.TRAIN_BUSY_SECONDS: 0.4,
                catalog.TRAIN_COLLECTIVE_WAIT_RATIO: 0.2, catalog.TRAIN_STRAGGLER_SCORE: 0.6,
                catalog.TRAIN_STRAGGLING: 1.0, catalog.TRAIN_WAITED_FOR_SCORE: 0.9,
                catalog.TRAIN_STRAGGLER_SCORE_THRESHOLD: STRAGGLER_SCORE_THRESHOLD,
                catalog.TRAIN_LOSS: 2.5, catalog.TRAIN_LOSS_NONFINITE: 0.0,
                catalog.TRAIN_LEARNING_RATE: 3e-4, catalog.TRAIN_GRAD_NORM: 1.5,
                catalog.MONITOR_INTERNAL_ERRORS_TOTAL: 0.0}
    assert {m.name: values.get(m.name) for m in expected} == {
        m.name: v for m, v in expected.items()}, values


def test_unknown_figures_are_no_series_rather_than_a_wrong_one():
    pub = _pub()
    _log(pub, loss=2.5, loss_nonfinite=False, straggler_score=0.6, straggling=False)
    values = _log(pub, straggling=True)  # no score: the flag means nothing; no loss: no flag
    for metric in (catalog.TRAIN_LOSS, catalog.TRAIN_LOSS_NONFINITE,
                   catalog.TRAIN_STRAGGLER_SCORE, catalog.TRAIN_STRAGGLING,
                   catalog.TRAIN_STRAGGLER_SCORE_THRESHOLD,  # no score, no line beside it
                   catalog.TRAIN_MFU_RATIO, catalog.TRAIN_DESCHEDULED_RATIO):
        assert metric.name not in values, (metric.name, values)


def test_a_nonfinite_loss_is_served_flagged():
    values = _log(_pub(), loss=math.nan, loss_nonfinite=True, loss_first_nonfinite_step=7)
    assert values[catalog.TRAIN_LOSS_NONFINITE.name] == 1.0
    assert values[catalog.TRAIN_LOSS_FIRST_NONFINITE_STEP.name] == 7.0


def test_a_save_and_the_goodput_counters_are_served():
    pub = _pub()
    pub.checkpoint_saved(SaveTimes(seconds=2.0, own_seconds=1.5, time_ratio=0.3))
    pub.goodput(90.0, {"stall": 6.0}, None)
    values = pub.snapshot["values"]
    assert [values.get(m.name) for m in (
        catalog.TRAIN_CHECKPOINT_SECONDS, catalog.TRAIN_CHECKPOINT_OWN_SECONDS,
        catalog.TRAIN_CHECKPOINT_TIME_RATIO, catalog.TRAIN_PRODUCTIVE_SECONDS_TOTAL,
        catalog.TRAIN_GOODPUT_RATIO)] == [2.0, 1.5, 0.3, 90.0, None], values
    assert pub.snapshot["badput_totals"] == {"stall": 6.0}
    pub.count_errors(4)
    assert values[catalog.MONITOR_INTERNAL_ERRORS_TOTAL.name] == 4


# ---- where the rank is, and since when ----------------------------------------------------

@pytest.fixture
def calls(monkeypatch):
    """The collective counters the heartbeat reads, as the wrapper leaves them."""
    state = {"seq": 0, "done": 0, "inside": False}
    monkeypatch.setattr(collectives, "progress",
                        lambda: (state["seq"], state["done"], state["inside"]))
    return state


def test_the_position_carries_the_collectives_and_the_phase(calls, monkeypatch):
    pub = _pub()
    calls.update(seq=42, done=41, inside=True)
    for i, phase in enumerate(PROGRESS_PHASES):
        pub.phase = phase
        assert pub._where()[:4] == (42.0, 41.0, 1.0, float(i)), phase
    pub.phase = "evaluation"  # a phase of the loop's own: counted as other
    assert pub._where()[3] == float(PROGRESS_PHASES.index("other"))


def test_a_position_is_stamped_when_first_seen_and_a_step_with_its_own_time(calls, monkeypatch):
    pub = _pub()
    clock = iter([100.0, 200.0, 300.0])  # the module's clock only (the stamp's "now")
    monkeypatch.setattr(publish_mod, "time", SimpleNamespace(time=lambda: next(clock)))
    assert pub._where()[4] == 100.0  # first seen: now
    assert pub._where()[4] == 100.0  # unchanged: since then
    calls["seq"] = 1
    assert pub._where()[4] == 200.0  # a collective entered: now
    pub._progress = (150.0, 1.0, 1.0, 0.0)  # a step done at 150 (its own time)
    assert pub._where()[4] == 150.0
    pub._progress = (0.0, 2.0, 2.0, 0.0)  # a step without a time: now
    assert pub._where()[4] == 300.0


def test_the_stall_bound_is_drawn_for_the_position_the_heartbeat_last_published(calls):
    """The watchdog's bound reads the publication's position: none before the first beat; then
    the phase, inside a collective or not, and the stamp the heartbeat carries."""
    pub = _pub()
    assert pub._bound_position() is None
    pub.watchdog.step_done(0.5)  # a step time is known: past warm-up
    calls.update(seq=7, done=6, inside=True)
    pub.phase = "forward"
    since = pub._where()[4]
    position = pub._bound_position()
    assert (position.phase, position.inside, position.since) == ("forward", True, since)
    assert pub.watchdog.bound().kind == "collective"
    calls.update(done=7, inside=False)
    pub._where()
    assert not pub._bound_position().inside and pub.watchdog.bound().kind == "steps"
    pub.phase = "checkpoint"
    assert pub.watchdog.bound().kind == "checkpoint"


def test_a_save_bounds_the_next_save(calls):
    pub = _pub()
    pub.checkpoint_saved(SaveTimes(50.0, 10.0, 0.2))
    assert pub.watchdog.history.longest_save == 50.0


# ---- the stall's evidence -----------------------------------------------------------------

class Stacks:
    def __init__(self) -> None:
        self.said: list[str] = []

    def due(self) -> bool:
        return True  # a refresh is due at every tick here

    def publish(self) -> None:
        self.said.append("publish")

    def clear(self) -> None:
        self.said.append("clear")


class Flight:
    def __init__(self) -> None:
        self.stalls: list[tuple] = []

    def stall_started(self, *args: object) -> None:
        self.stalls.append(args)


def test_stacks_and_one_flight_record_on_entering_a_stall_and_cleared_on_leaving(calls):
    pub = _pub()
    pub.stacks, pub.flight = Stacks(), Flight()
    pub._progress = (100.0, 12.0, 5.0, 0.0)  # step 12 of a resumed run, done at 100 s
    pub._stall_changed(True, 30.0)
    pub._stall_changed(True, 30.0)  # still stalled: nothing again
    assert pub._stall == (1.0, 30.0)
    assert (pub.stacks.said, len(pub.flight.stalls)) == (["publish"], 1)
    assert pub.flight.stalls[0][1:3] == (30.0, 12.0)  # the threshold crossed, at step 12
    pub._stall_changed(False, 30.0)
    assert (pub._stall, pub.stacks.said, len(pub.flight.stalls)) == (
        (0.0, 30.0), ["publish", "clear"], 1)


def test_a_failing_stack_publisher_is_counted_not_raised(calls):
    failures: list = []
    pub = _pub(failures)
    pub.stacks = Stacks()
    pub.stacks.publish = lambda: 1 / 0
    pub._stall_changed(True, 30.0)
    assert [w for w, _ in failures] == ["stack evidence"], failures


# ---- how the exit record ends -------------------------------------------------------------

class Record:
    def __init__(self) -> None:
        self.ended: list[tuple] = []

    def end(self, how: str, step: float, error: str = "") -> None:
        self.ended.append((how, step, error))


@pytest.mark.parametrize(("sigterm", "error", "ended"), [
    (False, None, (EXIT_NORMAL, 12.0, "")),
    (False, ValueError("x"), (EXIT_ERROR, 12.0, "ValueError")),
    (True, ValueError("x"), (EXIT_SIGTERM, 12.0, "")),  # the agent stopped us: not our error
])
def test_the_exit_record_says_how_the_rank_ended(monkeypatch, sigterm, error, ended):
    monkeypatch.setattr(exit_cleanup, "ending", lambda: "sigterm" if sigterm else None)
    pub, record = _pub(), Record()
    pub._progress = (1.0, 12.0, 5.0, 0.0)  # step 12 of a resumed run, its 5th step here
    pub._end_record(record, error)
    assert record.ended == [ended]


def test_closing_ends_the_exit_record_once():
    pub, record = _pub(), Record()
    pub.exit_record = record
    pub._progress = (1.0, 12.0, 5.0, 0.0)
    pub.close()
    pub.close()
    assert record.ended == [(EXIT_NORMAL, 12.0, "")]


# ---- the heartbeat, each step and each watchdog tick --------------------------------------

class Writer:
    def __init__(self) -> None:
        self.beats: list[tuple] = []

    def heartbeat(self, *args: float) -> None:
        self.beats.append(args)

    def snapshot(self, doc: dict) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_heartbeat_before_any_step_says_nothing_happened_yet(calls):
    pub = _pub()
    pub.writer = Writer()
    pub._beat()
    (beat,) = pub.writer.beats
    floor = MonitorConfig().stall_floor_seconds
    assert beat[:7] == (0.0, 0.0, 0.0, 0.0, 0.0, floor, 0.0), beat


def test_the_stall_bound_published_before_any_step_is_the_configured_floor(calls):
    """FSDPMON_STALL_FLOOR_SECONDS reaches the heartbeat (and so the served stall bound the
    alert rules compare with) from the first beat, whatever the default."""
    pub = Publication(MonitorConfig.from_env({"FSDPMON_STALL_FLOOR_SECONDS": "7.5"}, port=0,
                                             job_name="j"),
                      DistEnv(rank=0, local_rank=0), {}, lambda where, exc: None)
    pub.writer = Writer()
    pub._beat()
    assert pub.writer.beats[0][5] == 7.5 != MonitorConfig().stall_floor_seconds


def test_each_step_beats_with_its_number_the_steps_and_tokens(calls):
    pub = _pub()
    pub.writer = Writer()
    before = time.time()
    pub.step_done(12, 5, 640, 0.1)
    (beat,) = pub.writer.beats
    assert beat[1:4] == (12.0, 5.0, 640.0), beat
    assert before <= beat[0] <= time.time(), (before, beat[0])


def test_a_watchdog_tick_beats_and_refreshes_the_stacks_only_while_stalled(calls):
    pub = _pub()
    pub.writer, pub.stacks = Writer(), Stacks()
    before = time.time()
    pub._watchdog_tick()
    assert pub.stacks.said == [], pub.stacks.said  # not stalled: no stacks
    assert before <= pub.writer.beats[-1][6] <= time.time(), pub.writer.beats
    pub._stall = (1.0, 30.0)
    pub._watchdog_tick()
    assert pub.stacks.said == ["publish"], pub.stacks.said


def test_a_log_step_moves_the_exit_records_step():
    class Progress(Record):
        def progress(self, step: float) -> None:
            self.ended.append(("progress", step, ""))

    pub = _pub()
    pub.exit_record = Progress()
    pub._progress = (100.0, 12.0, 5.0, 0.0)
    _log(pub)
    assert pub.exit_record.ended == [("progress", 12.0, "")]


# ---- the pod's server ---------------------------------------------------------------------

@pytest.mark.parametrize(("local_rank", "delay"), [(0, 0.0), (1, 0.7), (2, 0.7)])
def test_local_rank_0_starts_the_pods_server_at_once_the_others_a_retry_later(
        tmp_path, monkeypatch, local_rank, delay):
    started: list[float] = []

    class Keeper:
        def __init__(self, directory, config, first_check_delay: float) -> None:
            started.append(first_check_delay)

        def start(self) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(publish_mod, "ServerKeeper", Keeper)
    config = MonitorConfig(port=free_port(), job_name="j", state_dir=str(tmp_path),
                           server_retry_seconds=0.7, listen_address="127.0.0.1")
    topo = DistEnv(rank=local_rank, local_rank=local_rank, world_size=3, local_world_size=3)
    pub = Publication(config, topo, {}, lambda *a: None)
    try:
        pub._start_serving(config, topo)
        assert started == [delay], (local_rank, started)
    finally:
        pub.close()
