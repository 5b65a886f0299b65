"""Real faults in the trainer, from the one spec grammar (``fsdpmon.faultspec``); inert unless set.

``FSDPMON_FAULT`` and ``--fault`` (both apply) are parsed once at start, before any process
group exists, so a bad spec is one line and exit 2. Each rank keeps only the faults aimed at
it (``FaultPlan.for_rank``); the loop then calls a few cheap hooks that do nothing when the
plan is empty. Steps are counted as the console shows them: step S is the S-th completed
optimiser step, and "after step S" is right after it completes.

What each kind does, and why it is made that way:
- compute-slow, data-slow and checkpoint-slow act from step ``from_step`` on, and not before
  ``after`` seconds past this rank's first completed step (a test that needs a healthy stretch
  of known length, whatever the machine's speed).
- compute-slow: after this rank's forward and after its backward, sleep (factor - 1) x the
  compute time that phase just took. Sleeping (rather than burning CPU) slows this rank alone
  by the asked factor without stealing cores from the other ranks on a shared CPU host, which
  would slow them too and blur which rank is the straggler. Compute time on CPU is the
  process's CPU time in the phase (``compute_clock``): its wall time also holds the waits for
  the other ranks at FSDP's all-gathers and the time the OS ran other processes, and scaling
  those too would slow a time-sliced rank by far more than the factor asked. On CUDA it is
  the host wall time of the phase.
- data-slow: each batch this rank loads takes ``seconds`` longer (inside ``next(loader)``),
  up to step ``until_step`` when set (a slow stretch that ends).
- hang: after step S, the rank blocks forever outside any collective: in plain Python in its
  data loader (``where=data``) or in a host-side call (``where=host``), or in a C call that
  holds the GIL (``where=gil``: no thread of it runs Python, its watchdog included); the others
  then wait in their next collective, as with a stuck filesystem read, a dead-locked host call
  or a C extension stuck without releasing the GIL.
- nonfinite-loss: the loss this rank reports becomes NaN/+Inf/-Inf. Backward still uses the
  real loss, so the fault stays on one rank (a real NaN would reach every rank's weights within
  one step and hide who started it) and the run goes on for the monitor to show.
- checkpoint-slow: this rank's saves (of step ``from_step`` and later) take ``seconds`` longer
  (inside the checkpoint phase, after its files are written, before the barrier).
- crash / crash-in-save: SIGKILL, like the OOM killer, on the first attempt only
  (TORCHELASTIC_RESTART_COUNT 0), so torchrun's restart runs through.
- pause: every rank holds still after step S (first attempt) and writes ``dir/pause.rank{r}``
  holding its pid, so a test can kill one rank from outside at a known point.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsdpmon import faultspec as fs
from fsdpmon.distenv import DistEnv

NONFINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _first_attempt() -> bool:
    return DistEnv.from_env().restart_count == 0


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def block_forever_in_host_call() -> None:
    """A host-side call that never returns (a stuck NFS read, a dead-locked library call)."""
    threading.Event().wait()


def block_forever_holding_the_gil() -> None:
    """A C call that never returns and never releases the GIL (a C extension stuck in a loop
    or a lock): ``ctypes.PyDLL`` keeps the GIL for the call, so no thread of this process runs
    Python again; its monitor's watchdog falls silent."""
    ctypes.PyDLL(None).pause()


class FirstStep:
    """When this rank completed its first step (monotonic), for the faults' ``after``."""

    def __init__(self) -> None:
        self.at: float | None = None

    def mark(self) -> None:
        if self.at is None:
            self.at = time.monotonic()

    def since(self) -> float:
        return 0.0 if self.at is None else time.monotonic() - self.at


def compute_clock(device_type: str) -> Callable[[], float]:
    """The clock whose difference over a phase is its compute time (see compute-slow)."""
    return time.process_time if device_type == "cpu" else time.perf_counter


@dataclass(frozen=True)
class FaultPlan:
    """The faults aimed at one rank; every hook is a no-op for the kinds it does not hold."""

    faults: tuple[Any, ...] = ()
    rank: int = 0
    world_size: int = 1
    first_step: FirstStep = field(default_factory=FirstStep, compare=False)

    @classmethod
    def for_rank(cls, faults: tuple[Any, ...], rank: int, world_size: int) -> FaultPlan:
        mine = tuple(f for f in faults if isinstance(f, fs.TRAINER_KINDS)
                     and fs.select([f], type(f), rank, world_size))
        return cls(mine, rank, world_size)

    def _of(self, cls: type) -> list[Any]:
        return [f for f in self.faults if isinstance(f, cls)]

    def _waited(self, after: float) -> bool:
        """``after`` seconds have passed since this rank's first step (0: always)."""
        return not after or (self.first_step.at is not None and self.first_step.since() >= after)

    def due(self, fault: Any, step: int) -> bool:
        """Whether a fault with ``from_step`` and ``after`` acts at ``step`` (now)."""
        return step >= fault.from_step and self._waited(fault.after)

    def hang_due(self, fault: fs.Hang, step: int) -> bool:
        """A hang acts at step ``at_step``, or (with ``after`` or ``gate``) at the first step
        past it that is ``after`` seconds past this rank's first step, once ``gate`` exists."""
        if fault.gate:
            return step >= fault.at_step and self._waited(fault.after) and os.path.exists(
                fault.gate)
        if not fault.after:
            return step == fault.at_step if fault.where != "data" else step >= fault.at_step
        return step >= fault.at_step and self._waited(fault.after)

    def slow_compute(self, step: int, seconds: float) -> None:
        """Called after forward and after backward of ``step`` with the time that phase took."""
        for f in self._of(fs.ComputeSlow):
            if self.due(f, step):
                time.sleep((f.factor - 1.0) * seconds)

    def wrap_loader(self, loader: Iterator[Any], current_step: Any) -> Iterator[Any]:
        """The loader, behind data-slow and hang(where=data) when aimed here."""
        if not (self._of(fs.DataSlow) or any(h.where == "data" for h in self._of(fs.Hang))):
            return loader
        return FaultyLoader(loader, self, current_step)

    def loss(self, step: int, value: Any) -> Any:
        for f in self._of(fs.NonfiniteLoss):
            if step >= f.from_step:
                return value * 0 + NONFINITE[f.value]
        return value

    def after_step(self, step: int) -> None:
        """Right after ``step`` completes: crash, host-side hang, pause."""
        self.first_step.mark()
        first = _first_attempt()
        for f in self._of(fs.Crash):
            if f.at_step == step and first:
                _die()
        for f in self._of(fs.Hang):
            if f.where == "host" and self.hang_due(f, step):
                block_forever_in_host_call()
            elif f.where == "gil" and self.hang_due(f, step):
                block_forever_holding_the_gil()
        for f in self._of(fs.Pause):
            if f.at_step == step and first:
                pause(Path(f.dir), self.rank)

    def in_save(self, step: int) -> None:
        """Inside the save of ``step``, after this rank's files are written, before the commit."""
        for f in self._of(fs.CheckpointSlow):
            if self.due(f, step):
                time.sleep(f.seconds)
        for f in self._of(fs.CrashInSave):
            if f.at_step == step and _first_attempt():
                _die()


class FaultyLoader:
    """Wraps the rank's loader: extra seconds per batch, or a hang inside ``next``."""

    def __init__(self, inner: Iterator[Any], plan: FaultPlan, current_step: Any) -> None:
        self.inner, self.plan, self.current_step = inner, plan, current_step

    def __getattr__(self, name: str) -> Any:  # position, state_dict, ... of the real loader
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("inner", "plan", "current_step"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def __iter__(self) -> FaultyLoader:
        return self

    def __next__(self) -> Any:
        step = self.current_step()  # steps completed so far
        for f in self.plan._of(fs.Hang):
            if f.where == "data" and self.plan.hang_due(f, step):
                hang_in_data_loader()
        for f in self.plan._of(fs.DataSlow):
            if self.plan.due(f, step + 1) and (not f.until_step or step + 1 <= f.until_step):
                time.sleep(f.seconds)
        return next(self.inner)


def hang_in_data_loader() -> None:
    """Never returns: a loader stuck on its input (the frame a stack dump should show)."""
    while True:
        time.sleep(1.0)


def pause(folder: Path, rank: int, max_seconds: float = 120.0) -> None:
    (folder / f"pause.rank{rank}").write_text(str(os.getpid()))
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
