"""What one rank publishes for the pod's endpoint: its state files and the watchdog.

The rank's snapshot (gauges, counters, histogram, job figures) is rewritten on log steps; the
heartbeat on every step. No rank serves HTTP: the pod's server process does, from these files
(``podserver``); each rank only makes sure one runs (``spawn``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsdpmon import catalog
from fsdpmon.conventions import (
    EXIT_ERROR,
    EXIT_NORMAL,
    EXIT_SIGTERM,
    PROGRESS_PHASES,
    STRAGGLER_SCORE_THRESHOLD,
)
from fsdpmon.distenv import DistEnv
from fsdpmon.errors import FsdpmonError
from fsdpmon.monitor import collectives, exit_cleanup, exit_record, statedir
from fsdpmon.monitor.checkpoint_time import SaveTimes
from fsdpmon.monitor.config import MonitorConfig
from fsdpmon.monitor.fingerprint import BREAK_SITE, Break, break_values
from fsdpmon.monitor.flight import FlightRecorder
from fsdpmon.monitor.spawn import ServerKeeper
from fsdpmon.monitor.stacks import StackPublisher
from fsdpmon.monitor.stall_bound import Position
from fsdpmon.monitor.state import RankStateWriter, job_state_dir
from fsdpmon.monitor.stats import JobFigures, WindowStats
from fsdpmon.monitor.timing import WindowTimes
from fsdpmon.monitor.watchdog import StallWatchdog
from fsdpmon.webconfig import load_web_config

log = logging.getLogger(__name__)

STEP_BUCKETS = catalog.TRAIN_STEP_DURATION_SECONDS.buckets
_PHASE_INDEX = {name: i for i, name in enumerate(PROGRESS_PHASES)}
_OTHER = len(PROGRESS_PHASES) - 1
INFO_KEYS = ("model", "world_size", "nodes", "dtype", "torch_version", "node", "device")

FailHandler = Callable[[str, BaseException], None]


class Publication:
    def __init__(self, config: MonitorConfig, topo: DistEnv, run_record: dict[str, Any],
                 fail: FailHandler) -> None:
        self._fail = fail
        self._lock = threading.Lock()
        self._progress = (0.0, 0.0, 0.0, 0.0)  # last step unix, step, steps, tokens
        self._fingerprint: tuple[float, tuple[int, int, int] | None] | None = None
        self._break: Break | None = None  # the pattern break published (fingerprint.Break)
        self._stall = (0.0, config.stall_floor_seconds)
        self._watchdog_seen = 0.0
        self.writer: RankStateWriter | None = None
        self.exit_record: exit_record.ExitRecord | None = None
        self.keeper: ServerKeeper | None = None
        self.stacks: StackPublisher | None = None
        self.phase = ""  # the phase the training thread is in ("" between phases)
        self.flight: FlightRecorder | None = None  # the monitor's, for a stall's evidence
        self.previous: exit_record.PreviousExit | None = None  # how the last incarnation ended
        self._position: tuple[Any, ...] = ()  # where the rank was at the last heartbeat ...
        self._position_since = 0.0  # ... and since when (unix)
        self._training_thread = threading.get_ident()  # the monitor is made on it
        self.snapshot: dict[str, Any] = {
            "pid": os.getpid(), "rank": topo.rank, "local_rank": topo.local_rank,
            "job_name": config.job_name, "started_unix": time.time(),
            "info": {k: run_record.get(k, "") for k in INFO_KEYS},
            "values": {}, "phase_totals": {}, "phase_means": {},
            "histogram": {"counts": [0] * (len(STEP_BUCKETS) + 1), "sum": 0.0},
        }
        self.watchdog = StallWatchdog(config.stall_factor, config.stall_floor_seconds,
                                      self._stall_changed, on_tick=self._watchdog_tick,
                                      wait_floor_seconds=config.stall_wait_floor_seconds,
                                      where=self._bound_position)

    @classmethod
    def start(cls, config: MonitorConfig, topo: DistEnv, run_record: dict[str, Any],
              fail: FailHandler) -> Publication | None:
        if config.disabled:
            return None
        pub = cls(config, topo, run_record, fail)
        if config.serves:
            pub._start_serving(config, topo)
        pub.watchdog.start()
        return pub

    def _start_serving(self, config: MonitorConfig, topo: DistEnv) -> None:
        directory = job_state_dir(config.job_name, config.port, config.state_dir)
        self.web = load_web_config(config.web_config_file, "FSDPMON_WEB_CONFIG_FILE")
        if not self._in_state_dir(lambda: self._sweep(directory, config.port)):
            return
        with exit_cleanup.covering():  # a SIGTERM during start-up finds every file registered
            self._publish_files(directory, config, topo)

    def _in_state_dir(self, action: Callable[[], None]) -> bool:
        """Run a start-up step on the state directory: another job's directory or port refuses
        the start (FsdpmonError); any other trouble there turns publishing off (False)."""
        try:
            action()
        except FsdpmonError:
            raise
        except OSError as exc:
            self._fail("state directory", exc)
            return False
        return True

    @staticmethod
    def _sweep(directory: Path, port: int) -> None:
        for stale in statedir.remove_stale(directory.parent):
            log.info("fsdpmon: removed %s, left by a job that is gone", stale)
        statedir.check_port_free(directory, port)

    def _open_writer(self, directory: Path, rank: int) -> None:
        self.writer = RankStateWriter(directory, rank)

    def _publish_files(self, directory: Path, config: MonitorConfig, topo: DistEnv) -> None:
        if not self._in_state_dir(lambda: self._open_writer(directory, topo.rank)):
            return
        self._keep_exit_record(directory, topo)
        exit_cleanup.register(self.writer.close)  # SIGTERM too, not only a normal exit
        self.stacks = StackPublisher(directory, topo.rank, topo.local_rank,
                                     self._training_thread, self._stack_context)
        collectives.install()
        try:
            self._beat()
        except Exception as exc:
            self._fail("heartbeat", exc)  # serve anyway: the snapshot may still be good
        # Local rank 0 starts the pod's server at once; the others check a retry period later
        # (and every period after), and start one when none runs.
        delay = 0.0 if topo.local_rank == 0 else config.server_retry_seconds
        self.keeper = ServerKeeper(directory, config, delay)
        self.keeper.start()
        exit_cleanup.register(self.keeper.close)  # after the files go: the last rank ends it

    def _keep_exit_record(self, directory: Path, topo: DistEnv) -> None:
        """Publish how this rank's previous incarnation ended (after a restart), then keep this
        one's record (see exit_record); its ending is written before the state files go."""
        try:
            previous = exit_record.read_previous(directory, topo.rank, topo.restart_count,
                                                 time.time())
            self.previous = previous
            if previous is not None:
                self.snapshot["previous_exit"] = previous.how
                self._set_values({
                    catalog.TRAIN_PREVIOUS_EXIT_STEP.name: previous.step,
                    catalog.TRAIN_PREVIOUS_EXIT_TIMESTAMP_SECONDS.name: previous.unix})
            self.exit_record = exit_record.ExitRecord(directory, topo.rank, topo.restart_count)
        except OSError as exc:
            self._fail("exit record", exc)
            return
        exit_cleanup.register(self._end_at_exit)

    def _end_at_exit(self) -> None:
        """Clean-up at SIGTERM or interpreter exit (the loop never closed the monitor)."""
        self._end_record(self.exit_record, getattr(sys, "last_value", None))  # uncaught

    def _end_record(self, record: exit_record.ExitRecord | None,
                    error: BaseException | None) -> None:
        if record is None:
            return
        step = self._progress[1]
        if exit_cleanup.ending() is not None:
            record.end(EXIT_SIGTERM, step)
        elif error is not None:
            record.end(EXIT_ERROR, step, type(error).__name__)
        else:
            record.end(EXIT_NORMAL, step)

    # ---- per step (training thread) -----------------------------------------------------

    def arm(self) -> None:
        self.watchdog.arm()

    def step_done(self, step: int, steps: int, tokens: int, host_seconds: float) -> None:
        self.watchdog.step_done(host_seconds)
        self._fingerprint = (float(step), collectives.last_step())  # one store: see _calls
        if collectives.last_break() is not self._break:  # this step broke its pattern
            self._break = collectives.last_break()
            self._set_values(break_values(step, self._break))  # type: ignore[arg-type]
            self.snapshot[BREAK_SITE] = self._break.site  # type: ignore[union-attr]
        self._progress = (time.time(), float(step), float(steps), float(tokens))
        if self.writer is not None:
            self._beat()

    def progress(self) -> None:
        """Progress other than a completed step (a checkpoint saved): resets the stall clock."""
        self.watchdog.step_done(None)

    def _beat(self) -> None:
        with self._lock:
            if self.writer is not None:
                self.writer.heartbeat(*self._progress, *self._stall, self._watchdog_seen,
                                      self._where(),
                                      _calls(self._fingerprint, self._progress[1]))

    def _where(self) -> tuple[float, float, float, float, float]:
        """The progress evidence, stamped with the time it was first seen unchanged: a stuck
        rank's stays put, to the watchdog's tick (no clock read on the training thread: a step's
        heartbeat always moves the step, and takes the step's own time)."""
        entered, completed, inside = collectives.progress()
        phase = _PHASE_INDEX.get(self.phase, _OTHER)
        where = (self._progress[1], phase, entered, completed, inside)
        if where != self._position:
            stepped = (bool(self._position) and where[0] != self._position[0]
                       and self._progress[0] > 0)
            self._position = where
            self._position_since = self._progress[0] if stepped else time.time()
        return (float(entered), float(completed), float(inside), float(phase),
                self._position_since)

    def _bound_position(self) -> Position | None:
        """Where the stall bound is drawn for (the watchdog thread, after its tick's beat): the
        phase, inside a collective or not, and since when (None before the first beat)."""
        if not self._position:
            return None
        return Position(self.phase, bool(self._position[4]), self._position_since)

    def _watchdog_tick(self) -> None:
        self._watchdog_seen = time.time()
        self._beat()
        if self._stall[0] and self.stacks is not None and self.stacks.due():
            self._publish_stack(True)  # still stalled: where is it now?

    def _stall_changed(self, stalled: bool, threshold: float) -> None:
        was_stalled = bool(self._stall[0])
        self._stall = (1.0 if stalled else 0.0, threshold)
        if stalled != was_stalled:
            self._publish_stack(stalled)
            if stalled and self.flight is not None:
                self._record_flight(threshold)
        try:
            self._beat()
        except Exception as exc:
            self._fail("heartbeat", exc)

    def _publish_stack(self, stalled: bool) -> None:
        """Stack evidence while stalled (watchdog thread): written on entering, refreshed, and
        removed when steps resume; never on the training thread, never per step."""
        if self.stacks is None:
            return
        try:
            if stalled:
                self.stacks.publish()
            else:
                self.stacks.clear()
        except Exception as exc:
            self._fail("stack evidence", exc)

    def _record_flight(self, threshold: float) -> None:
        """The flight recorder's one record of this stall (watchdog thread)."""
        flight = self.flight
        if flight is None:
            return
        try:
            step, phase, entered = self._stack_context()
            flight.stall_started(self.watchdog.progress_unix(), threshold, step, phase,
                                      entered)
        except Exception as exc:
            self._fail("flight recorder", exc)

    def goodput(self, productive: float, badput: dict[str, float], ratio: float | None) -> None:
        """The job's goodput counters (rank 0), written with the next snapshot."""
        self._set_values({catalog.TRAIN_PRODUCTIVE_SECONDS_TOTAL.name: productive,
                          catalog.TRAIN_GOODPUT_RATIO.name: ratio})
        self.snapshot["badput_totals"] = dict(badput)

    def _stack_context(self) -> tuple[float, str, tuple[str, int] | None]:
        return self._progress[1], self.phase, collectives.last_entered()

    # ---- per log step -------------------------------------------------------------------

    def static_values(self, values: dict[str, float | None]) -> None:
        self._set_values(values)
        self._write()

    def log_step(self, stats: WindowStats, record: dict[str, Any], memory: dict[str, float],
                 times: WindowTimes, errors: int, job: JobFigures | None) -> None:
        hist = self.snapshot["histogram"]
        for seconds in times.step_seconds:
            hist["counts"][_bucket(seconds)] += 1
            hist["sum"] += seconds
        totals = self.snapshot["phase_totals"]
        for phase, seconds in times.phase_seconds.items():
            totals[phase] = totals.get(phase, 0.0) + seconds
        self.snapshot["phase_means"] = dict(stats.phase_means)
        loss = record.get("loss")
        scored = record.get("straggler_score") is not None or record.get(
            "waited_for_score") is not None
        self._set_values({
            catalog.TRAIN_TOKENS_PER_SECOND.name: stats.tokens_per_second,
            catalog.TRAIN_STEP_TIME_SECONDS.name: stats.step_time_s,
            catalog.TRAIN_DATA_WAIT_RATIO.name: stats.data_wait_ratio,
            catalog.TRAIN_BUSY_SECONDS.name: record.get("busy_s"),
            catalog.TRAIN_COLLECTIVE_WAIT_RATIO.name: stats.collective_wait_ratio,
            catalog.TRAIN_STRAGGLER_SCORE.name: record.get("straggler_score"),
            catalog.TRAIN_STRAGGLING.name: (None if record.get("straggler_score") is None
                                            else record["straggling"]),
            catalog.TRAIN_WAITED_FOR_SCORE.name: record.get("waited_for_score"),
            # the line the scores are judged by (straggling.py), beside them: the rules read it
            catalog.TRAIN_STRAGGLER_SCORE_THRESHOLD.name: (STRAGGLER_SCORE_THRESHOLD if scored
                                                           else None),
            catalog.TRAIN_DESCHEDULED_RATIO.name: record.get("descheduled_span_ratio"),
            catalog.TRAIN_CPU_THROTTLED_RATIO.name: record.get("cpu_throttled_ratio"),
            catalog.TRAIN_MFU_RATIO.name: stats.mfu,
            catalog.TRAIN_LOSS.name: loss,
            catalog.TRAIN_LEARNING_RATE.name: record.get("lr"),
            catalog.TRAIN_GRAD_NORM.name: record.get("grad_norm"),
            catalog.TRAIN_LOSS_NONFINITE.name: None if loss is None else record["loss_nonfinite"],
            catalog.TRAIN_LOSS_FIRST_NONFINITE_STEP.name: record.get(
                "loss_first_nonfinite_step"),
            catalog.TRAIN_GRAD_NORM_FIRST_NONFINITE_STEP.name: record.get(
                "grad_norm_first_nonfinite_step"),
            catalog.MONITOR_INTERNAL_ERRORS_TOTAL.name: errors,
            **memory,
        })
        if job is not None:
            self.snapshot["job"] = job.as_metrics()
        self._write()
        if self.exit_record is not None:
            self.exit_record.progress(self._progress[1])

    def checkpoint_saved(self, times: SaveTimes) -> None:
        """A save finished (training thread, once per checkpoint): its times, served until the
        next save; the next saves' stall bound is drawn from it."""
        self.watchdog.save_done(times.seconds)
        self._set_values({
            catalog.TRAIN_CHECKPOINT_SECONDS.name: times.seconds,
            catalog.TRAIN_CHECKPOINT_OWN_SECONDS.name: times.own_seconds,
            catalog.TRAIN_CHECKPOINT_TIME_RATIO.name: times.time_ratio,
        })
        self._write()

    def count_errors(self, errors: int) -> None:
        self.snapshot["values"][catalog.MONITOR_INTERNAL_ERRORS_TOTAL.name] = errors
        try:
            self._write()
        except Exception:  # reporting a failure must not fail again
            log.debug("fsdpmon: could not publish the error count", exc_info=True)

    def _set_values(self, values: dict[str, Any]) -> None:
        current = self.snapshot["values"]
        for name, value in values.items():
            if value is None:
                current.pop(name, None)  # unknown: no series rather than a wrong one
            else:
                current[name] = float(value)

    def _write(self) -> None:
        if self.writer is not None:
            self.writer.snapshot(self.snapshot)

    def close(self, error: BaseException | None = None) -> None:
        """Stop publishing; ``error``: the exception that ended the training loop, if any."""
        record, self.exit_record = self.exit_record, None
        if record is not None:
            exit_cleanup.unregister(self._end_at_exit)
            self._end_record(record, error)
        self.watchdog.close()
        if self.stacks is not None:
            self.stacks.clear()
        if self.keeper is not None:
            exit_cleanup.unregister(self.keeper.close)
            self.keeper.close()
        with self._lock:
            writer, self.writer = self.writer, None
        if writer is not None:
            exit_cleanup.unregister(writer.close)
            writer.close()


def _bucket(seconds: float) -> int:
    for i, bound in enumerate(STEP_BUCKETS):
        if seconds <= bound:
            return i
    return len(STEP_BUCKETS)


def _calls(fingerprint: tuple[float, tuple[int, int, int] | None] | None,
           step: float) -> tuple[float, ...]:
    """The collectives' identity for the heartbeat: the fingerprint of the step the heartbeat
    names (its calls, hash, sequence number at its end; -1 calls: none), taken when that step
    was published, not read now: the watchdog's beat may fall between the next step's end and
    its publication, and would pair that step's fingerprint with this one's number. Then the
    call entered last."""
    stepped, last = fingerprint or (None, None)
    calls, hashed, seq = last if last is not None and stepped == step else (-1, 0, 0)
    return (float(calls), float(hashed), float(seq),
            *(float(v) for v in collectives.entered_call()))
