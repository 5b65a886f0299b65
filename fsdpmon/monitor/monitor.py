"""The Monitor: what a training loop calls each step.

Non-log steps cost a few microseconds of host time: two clock marks, counter updates and one
``pack_into`` on a memory-mapped heartbeat. Everything else — reading the device timers and the
loss (the only syncs), memory statistics, the one small all-gather, the JSONL line and the
state file the endpoint serves — happens once per log interval.

Nothing here raises into training: every entry point catches its own failures, logs each kind
once and counts it in ``fsdpmon_monitor_internal_errors_total``.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

try:
    import torch  # noqa: F401  (only to say what to install when it is missing)
except ModuleNotFoundError as exc:  # the base install (`pip install fsdpmon`) has no torch
    raise ModuleNotFoundError("the in-trainer monitor needs the 'train' extra: "
                              "pip install 'fsdpmon[train]'", name="torch") from exc
from torch import nn

from fsdpmon import catalog
from fsdpmon.conventions import CHECKPOINT_PHASE
from fsdpmon.distenv import DistEnv
from fsdpmon.errors import FsdpmonError
from fsdpmon.monitor import checkpoint_time, collectives, exit_cleanup
from fsdpmon.monitor.collectives import CollectiveTimer
from fsdpmon.monitor.config import MonitorConfig
from fsdpmon.monitor.cpustat import CgroupThrottling
from fsdpmon.monitor.device import intended_syncs, uses_cuda
from fsdpmon.monitor.failures import Failures
from fsdpmon.monitor.flight import FlightRecorder, process_start_unix
from fsdpmon.monitor.flops import model_flops_per_token, peak_flops_for
from fsdpmon.monitor.gather import is_distributed, topology
from fsdpmon.monitor.goodput_meter import GoodputMeter, window_row
from fsdpmon.monitor.jsonl import JsonlSink
from fsdpmon.monitor.log_window import ROW_AT, LogWindow, local_row, own_scores
from fsdpmon.monitor.memory import MemoryReader
from fsdpmon.monitor.nonfinite import WATCHED, NonfiniteWatch
from fsdpmon.monitor.publish import Publication
from fsdpmon.monitor.records import CpuFigures, as_float, run_record, step_record
from fsdpmon.monitor.span import Span
from fsdpmon.monitor.stats import BUSY_MIN_STEPS, WindowStats, job_figures
from fsdpmon.monitor.straggling import StragglingFlag
from fsdpmon.monitor.timing import CudaClock, HostClock, StepTimer

LogListener = Callable[[dict[str, Any]], None]


class Monitor:
    def __init__(self, config: MonitorConfig | None = None, *, model: nn.Module | None = None,
                 flops_per_token: float | None = None, seq_len: int | None = None,
                 tokens_per_step: int = 0, total_steps: int | None = None, start_step: int = 0,
                 run_info: dict[str, Any] | None = None) -> None:
        self.config = config or MonitorConfig.from_env()
        self.failures = Failures(self._serve_error_count)
        self._guarded, self._fail = self.failures.guarded, self.failures.fail
        self._listeners: list[LogListener] = []
        self._closed = False
        self.tokens_per_step = int(tokens_per_step)
        self.total_steps = total_steps
        self.step_number = int(start_step)
        self.steps_done = self.tokens_done = 0
        self._pending: dict[str, Any] = {}
        self._this_step: dict[str, Any] = {}  # what record() was given during this step
        self._nonfinite = NonfiniteWatch()
        self._window = LogWindow()
        self._spans: dict[str, Span] = {}
        self.auto_log = True  # log every config.log_interval steps; off when the loop decides
        self.pub: Publication | None = None
        self.jsonl: JsonlSink | None = None
        # Safe defaults, so that a failure in any part of set-up leaves the rest working.
        self.topo = DistEnv()  # rank 0 of 1
        self._timer = StepTimer(HostClock())
        self._collectives: CollectiveTimer | None = None
        self._saves = checkpoint_time.CheckpointClock(distributed=False)
        self._throttling: CgroupThrottling | None = None
        self._straggling = StragglingFlag(span=BUSY_MIN_STEPS)
        self.device, self.peak_flops = "cpu", None
        self.flops_per_token = float(flops_per_token or 0.0)
        self._memory: MemoryReader | None = None
        self.run_record: dict[str, Any] = {}
        self.process_start = process_start_unix()
        self.goodput = GoodputMeter(self.process_start)
        self.flight = FlightRecorder(0, self._write_jsonl, threading.get_ident())
        self._window_stall = 0.0  # stall seconds ended in this log window
        # A malformed launcher variable is logged and counted; the rest of set-up goes on.
        self.topo = self._guarded("topology", topology) or self.topo
        self.flight.rank = self.topo.rank
        self._guarded("setup", lambda: self._setup_core(model, flops_per_token, seq_len,
                                                        run_info or {}))
        self._guarded("jsonl", self._open_jsonl)
        try:
            self._start_publication()
        except FsdpmonError:
            self.close()  # refused at start: a state directory not ours, a port in use
            raise
        except Exception as exc:
            self._fail("publication", exc)
        self._step_span = Span(self.begin_step, self.end_step, self.abort_step)

    # ---- set-up -------------------------------------------------------------------------

    def _setup_core(self, model: nn.Module | None, flops: float | None, seq_len: int | None,
                    run_info: dict[str, Any]) -> None:
        cuda = uses_cuda(model)
        clock: HostClock | CudaClock = CudaClock() if cuda else HostClock()
        self._timer = StepTimer(clock)
        self.device = clock.device
        self.peak_flops = peak_flops_for(self.device) if cuda else None
        if flops is None and model is not None and seq_len:
            flops = model_flops_per_token(model, seq_len)
        self.flops_per_token = float(flops or 0.0)
        self.run_record = run_record(self.topo, self.config.job_name, model, run_info,
                                     self.flops_per_token, self.device, self.peak_flops)
        self.run_record["process_start"] = self.process_start
        self._memory = MemoryReader(cuda)
        self._throttling = CgroupThrottling()
        if is_distributed(self.topo):  # one rank alone waits for nobody
            self._collectives = CollectiveTimer(cuda)
            collectives.activate(self._collectives)
            self._saves = checkpoint_time.CheckpointClock(distributed=True)

    def _open_jsonl(self) -> None:
        if self.config.jsonl_path:
            self.jsonl = JsonlSink(self.config.jsonl_path, self.topo.rank)
            self.jsonl.write(self.run_record)
            exit_cleanup.register(self._record_end)  # SIGTERM too: the agent stopping us

    def _record_end(self, error: BaseException | None = None) -> None:
        self.flight.ended(self.step_number, error)

    def _start_publication(self) -> None:
        self.pub = Publication.start(self.config, self.topo, self.run_record, self._fail)
        if self.pub is not None:
            if self.topo.rank == 0:  # every goodput counter served from 0 before its first
                # rise: increase() counts only what rises after a series' first sample
                self.pub.goodput(self.goodput.productive, self.goodput.served(), None)
            self.pub.static_values(self._static_values())
            self.pub.flight = self.flight
            previous = self.pub.previous
            if previous is not None:
                self.flight.previous_exit(self.topo.restart_count, previous.how, previous.step,
                                          previous.unix)
                self.goodput.restart_from(previous.step, previous.last_progress)

    def _static_values(self) -> dict[str, float | None]:
        return {
            catalog.TRAIN_MODEL_FLOPS_PER_TOKEN.name: self.flops_per_token or None,
            catalog.TRAIN_DEVICE_PEAK_FLOPS.name: self.peak_flops,
            catalog.TRAIN_TOTAL_STEPS.name: self.total_steps,
            catalog.TRAIN_RESTARTS.name: self.run_record.get("restarts"),
            catalog.TRAIN_DEVICE_MEMORY_CAPACITY_BYTES.name: self._memory and self._memory.capacity,
            catalog.MONITOR_INTERNAL_ERRORS_TOTAL.name: self.internal_errors,
        }

    # ---- the training loop's API --------------------------------------------------------

    def add_log_listener(self, fn: LogListener) -> None:
        self._listeners.append(fn)

    def step(self) -> Span:
        """``with mon.step():`` around one optimiser step (all micro-batches)."""
        return self._step_span

    def phase(self, name: str) -> Span:
        """``with mon.phase("data"):`` — data, forward, backward, optimizer, checkpoint, ..."""
        span = self._spans.get(name)
        if span is None:
            span = self._spans[name] = Span(lambda: self._phase(name, True),
                                            lambda: self._phase(name, False))
        return span

    def record(self, *, loss: Any = None, lr: Any = None, grad_norm: Any = None,
               tokens: int | None = None, batch: Any = None) -> None:
        """Hand over this step's values; tensors stay on the device until a log step.

        ``batch``: what identifies this step's batch on this rank, e.g. the loader's position
        (a number or a small JSON object): kept with the first non-finite loss or grad norm, so
        the batch that produced it can be found and replayed."""
        pending, step = self._pending, self._this_step
        if loss is not None:
            pending["loss"] = step["loss"] = loss
        if lr is not None:
            pending["lr"] = lr
        if grad_norm is not None:
            pending["grad_norm"] = step["grad_norm"] = grad_norm
        if tokens is not None:
            pending["tokens"] = tokens
        if batch is not None:
            step["batch"] = batch

    def checkpoint_restored(self, step: int, seconds: float) -> None:
        """The loop loaded a checkpoint of ``step`` in ``seconds`` (before the first step):
        the restore's share of the badput, and the steps a restart makes again."""
        self._guarded("restore", lambda: (self.flight.restored(step, seconds),
                                          self.goodput.restore(step, seconds)))

    def begin_step(self) -> None:
        try:
            if self._window.start is None:
                self._window.start = time.perf_counter()
                self.goodput.first_step()
                self._saves.training_started()
                if self.pub is not None:
                    self.pub.arm()
            self._timer.begin_step()
            if self._collectives is not None:
                self._collectives.arm()
        except Exception as exc:
            self._fail("begin_step", exc)

    def abort_step(self) -> None:
        """Forget the step in progress (it raised): nothing is counted or timed."""
        if self._collectives is not None:
            self._collectives.step_done(completed=False)
        self._guarded("abort_step", self._timer.abort_step)
        self._pending.pop("tokens", None)
        self._this_step.clear()

    def end_step(self) -> None:
        try:
            if not self._timer.in_step:
                return
            if self._collectives is not None:
                self._collectives.step_done()
            host_seconds = self._timer.end_step()
            if self.flight.open_since is not None:
                self._end_stall("step")
            tokens = self._pending.pop("tokens", None)
            tokens = self.tokens_per_step if tokens is None else int(tokens)
            self.steps_done += 1
            self.step_number += 1
            self.tokens_done += tokens
            self._window.tokens += tokens
            if self._this_step:
                self._nonfinite.step_done(self.step_number, self._this_step)
                self._this_step.clear()
        except Exception as exc:
            self._fail("end_step", exc)
            return
        if self.pub is not None:
            try:
                self.pub.step_done(self.step_number, self.steps_done, self.tokens_done,
                                   host_seconds)
            except Exception as exc:
                self._fail("heartbeat", exc)
        if self.auto_log and (self.step_number % self.config.log_interval == 0
                              or self.step_number == self.total_steps):
            self._log_step()

    def log_now(self) -> None:
        """Run a log step now (for loops that decide themselves when to log, like HF's).

        Every rank must call it at the same points: it takes part in one collective.
        """
        if self.steps_done > 0:
            self._log_step()

    def begin_phase(self, name: str) -> None:
        """Callback-style loops (like HF's): ``begin_phase``/``end_phase`` instead of ``with``."""
        self._phase(name, True)

    def end_phase(self, name: str) -> None:
        self._phase(name, False)

    def _phase(self, name: str, entering: bool) -> None:
        if self.pub is not None:
            self.pub.phase = name if entering else ""  # one store: read only by a stall's evidence
        try:
            if entering:
                self._timer.begin_phase(name)
                if name == CHECKPOINT_PHASE and not self._timer.in_step:
                    self._saves.begin()
            else:
                self._timer.end_phase(name)
                saved = self._saves.end() if name == CHECKPOINT_PHASE else None
                if saved is not None:
                    self.flight.checkpoint(self.step_number, saved.seconds, saved.own_seconds)
                    self.goodput.checkpoint(saved.seconds)
                if self.flight.open_since is not None and not self._timer.in_step:
                    self._end_stall(name)  # a save or evaluation held the steps, not a stall
                if self.pub is not None and not self._timer.in_step:
                    # A phase between steps (a checkpoint save, an evaluation) that finished
                    # is progress too: the stall clock restarts from here.
                    self.pub.progress()
                    if saved is not None:
                        self.pub.checkpoint_saved(saved)
        except Exception as exc:
            self._fail("phase", exc)

    def _end_stall(self, during: str) -> None:
        durations = self.pub.watchdog.recent_durations() if self.pub is not None else []
        self._window_stall += self.flight.stall_ended(self.step_number + (during == "step"),
                                                      during, durations)

    # ---- log steps ----------------------------------------------------------------------

    def _log_step(self) -> None:
        with intended_syncs(self.device != "cpu"):
            self._log_step_unguarded()

    def _log_step_unguarded(self) -> None:
        stats = self._guarded("measure", self._measure_window)
        quality = self._guarded("values", self._read_values) or {}
        for first in self._guarded("non-finite values", self._nonfinite.scan) or ():
            self._write_jsonl(first.as_record(self.topo.rank, self.topo.local_rank, time.time()))
        memory = self._guarded("memory", self._memory.read) if self._memory else None
        peak_memory = memory.peak_bytes if memory else math.nan
        loss = quality.get("loss")
        # one rank alone waits for nobody: no waited-for view (and no run-queue reads)
        held, descheduled = self._window.waits.figures() if self._collectives else (None, None)
        window = self._guarded("goodput window", lambda: window_row(stats))
        local = local_row(stats, self._window.busy.known, peak_memory, loss, held, window)
        rows = self._window.gather(local, self.topo, self._fail)  # every rank, every log step
        job = self._guarded("job figures", lambda: job_figures(rows)
                            if rows is not None and self.topo.rank == 0 else None)
        scores = self._guarded("straggler scores", lambda: own_scores(
            rows, self.topo.rank)) if rows is not None else None
        score, waited = scores or (None, None)
        straggling = self._straggling.update(score, self.step_number, time.monotonic())
        cpu = CpuFigures(waited, descheduled, self._guarded(
            "cpu throttling", self._throttling.ratio) if self._throttling else None)
        record = self._guarded("record", lambda: step_record(
            self.topo, self.step_number, stats, quality, busy_known=self._window.busy.known,
            peak_memory=peak_memory, job=job, score=score, straggling=straggling,
            collective_calls=self._window.calls, tokens_total=self.tokens_done, cpu=cpu,
            first_nonfinite={w: self._nonfinite.first_step(w) for w in WATCHED}))
        if record is None:
            return
        if window is not None:
            record.update(window_seconds=stats.wall_seconds if stats else None,
                          step_seconds=window[0], data_seconds=window[1],
                          wait_seconds=window[2], steps=int(window[3]))
        self._guarded("goodput", lambda: self._count_goodput(rows, stats))
        pub, times = self.pub, self._window.times
        if pub is not None and stats is not None and times is not None:
            self._guarded("publish", lambda: pub.log_step(
                stats, record, memory.values if memory else {}, times, self.internal_errors, job))
        self._emit(record)

    def _count_goodput(self, rows: list[list[float]] | None, stats: WindowStats | None) -> None:
        """Rank 0: the job's window split by cause, added to the served counters."""
        stall, self._window_stall = self._window_stall, 0.0
        if self.topo.rank != 0 or rows is None or stats is None:
            return
        self.goodput.rows(rows, ROW_AT, stall, stats)
        if self.pub is not None:
            self.pub.goodput(self.goodput.productive, self.goodput.served(),
                             self.goodput.ratio())

    def _measure_window(self) -> WindowStats:
        return self._window.measure(self._timer, self._collectives, self.flops_per_token,
                                    self.peak_flops)

    def _read_values(self) -> dict[str, float | None]:
        pending, self._pending = self._pending, {}
        return {k: as_float(v) for k, v in pending.items() if k != "tokens"}

    def _write_jsonl(self, record: dict[str, Any]) -> None:
        if self.jsonl is not None:
            try:
                self.jsonl.write(record)
            except Exception as exc:
                self._fail("jsonl", exc)

    def _emit(self, record: dict[str, Any]) -> None:
        self._write_jsonl(record)
        for fn in self._listeners:
            try:
                fn(record)
            except Exception as exc:
                self._fail(f"listener {getattr(fn, '__name__', fn)!r}", exc)

    # ---- failures and shutdown ----------------------------------------------------------

    @property
    def internal_errors(self) -> int:
        return self.failures.count

    def _serve_error_count(self, count: int) -> None:
        if self.pub is not None:
            self.pub.count_errors(count)

    def close(self, error: BaseException | None = None) -> None:
        """``error``: the exception that ended training; by default the one propagating where
        close is called (a ``finally`` around the loop), if any. The restarted rank reports it
        (``fsdpmon_train_previous_exit``)."""
        if self._closed:
            return
        self._closed = True
        if error is None:
            error = sys.exc_info()[1]
            if isinstance(error, SystemExit) and error.code in (None, 0):
                error = None
        if self._collectives is not None:
            if collectives.active() is self._collectives:
                collectives.activate(None)
            self._collectives.close()
        if self.jsonl is not None:
            exit_cleanup.unregister(self._record_end)
            self._guarded("end record", lambda: self._record_end(error))
        pub, jsonl = self.pub, self.jsonl
        if pub is not None:
            self._guarded("close", lambda: pub.close(error))
        if jsonl is not None:
            self._guarded("close", jsonl.close)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, _type: object, error: BaseException | None, _tb: object) -> None:
        self.close(error)

