"""The one wrapper around every collective: it numbers each call (the last collective a rank
entered, for the stack evidence of a hang) and times the wait in it (for straggler attribution).

Sequence: PyTorch's flight recorder keys a hang by (process group, collective sequence number):
the ranks that stopped at a lower number are the ones the others wait for. Each call stores its
name and bumps a per-process counter (two stores, nothing allocated, nothing written anywhere);
the stack evidence reads it only while the rank is stalled. A call made inside another
(``all_gather_object`` calls ``all_gather``) counts once, as the outer one. Counted always,
between steps too, so the number is the same on every rank that made the same calls.

Fingerprint: a step's calls (on its own thread) hashed by op, elements, dtype and group; the
group as the order of its first use in a step (0: the default group), not its ranks or name:
HSDP's ranks {0,1} and {2,3} run one program on other groups of one role and must print alike.

Wait: busy time (step minus wait) names the straggler: in synchronous training every rank's
step lasts as long as the slowest rank's, and the fast ranks spend the difference waiting at
the collectives. The rank that waits least is the one the others wait for.

How it is measured, and why this way:
- The c10d Python entry points (``torch.distributed.all_gather_single``, ``all_reduce``, ...,
  which FSDP2, DTensor and user code call through the module attribute) and the functional
  collectives' ``wait_tensor`` (where DTensor's ``full_tensor()`` blocks; it waits for a
  collective already entered, so it is timed but not numbered) are wrapped once per process,
  by one wrapper that does both jobs (one Python frame per call, not two). Timing costs two
  clock reads per collective (~1 us; a tiny FSDP step makes a few dozen), nothing is
  allocated, and it works for any loop that uses torch.distributed, with no model hooks. The
  alternatives cost more or see less: FSDP2's module hooks do not bracket the waits;
  ``ProcessGroup._register_on_completion_hook`` exists only for NCCL; the flight recorder on
  gloo records no completion time; a profiler step is far over budget.
- CPU (gloo): host wall time inside the outermost blocking call is the wait (gloo blocks the
  calling thread until every peer has joined and the data has moved). Calls made with
  ``async_op=True`` return a ``Work`` that is waited on elsewhere and are not timed; FSDP2
  on CPU issues its all-gathers and reduce-scatters synchronously.
  Wall time outside the calls is not all the rank's own work on a host with more runnable
  threads than cores: the OS also makes it wait for a CPU. The timer reads the training
  thread's run-queue delay (fsdpmon.monitor.schedstat) at the step's start and end and around
  each timed call (one ~1 us ``pread`` each), so that delay outside the calls is left out of
  busy time and the delay inside them stays wait.
- CUDA: host time around an NCCL call is only the launch, so each call is bracketed by two
  CUDA events on the stream current at the call (FSDP2 issues its collectives on their own
  streams): their elapsed time is the device time of the collective, waiting for peers
  included. Events are pooled and read only at the log step, after the one synchronisation
  the step timer already makes there: no per-step device sync. Busy = the step's device time
  less its collectives' device time; where communication overlaps compute this undercounts
  every rank's busy time by about the same amount, so the ranking of ranks (all that the
  score uses) survives.
Only calls made while a step is open are timed (the monitor sets ``armed``), so the monitor's
own log-step gather and checkpoint collectives between steps are left out of the wait.
- DDP: its gradient all-reduce runs from C++, past these entry points; ``install`` also has
  fsdpmon.monitor.ddp give each DDP module a communication hook that calls ``all_reduce``
  through the wrapper and tells the timer when the async buckets were launched and completed
  (``async_launched``/``async_completed``; the blocked tail of each backward is wait).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fsdpmon.conventions import (
    C10D_NAMES,
    GROUP_AT,
    OP_CODES,
    POINT_TO_POINT,
    PRIVATE_NAMES,
    UNEVEN,
)
from fsdpmon.monitor import ddp
from fsdpmon.monitor.fingerprint import Break, Calls, by_keyword, know_tensors
from fsdpmon.monitor.schedstat import RunQueueDelay

_WRAPPED = "_fsdpmon_collective_wrapper"

@dataclass(frozen=True)
class StepWaits:
    """Per step completed since the last drain: seconds waited in collectives, and (CPU) seconds
    spent waiting for a CPU outside them (run-queue delay; 0.0 on CUDA or where unknown)."""

    collective: list[float]
    descheduled: list[float]
    descheduled_inside: list[float] = field(default_factory=list)  # run-queue delay in the calls


class CollectiveTimer:
    """Accumulates the wait of the calls made while armed, per step; ``drain`` at the log step.

    On CPU it also reads the step's run-queue delay (``schedstat``) at ``arm``, at ``step_done``
    and around each timed call, so the delay outside the collectives (time-slicing, not the
    rank's work) can be left out of busy time. The delay read is that of the thread that arms
    the steps (opened there on the first step, again if the steps move to another thread)."""

    def __init__(self, cuda: bool = False, run_queue: bool = True,
                 fingerprint: bool = True) -> None:
        self.cuda = cuda
        # False: its arming is no step of the fingerprint (a checkpoint's timer: its calls
        # would become the pattern the next step is compared with, and break it)
        self.fingerprint = fingerprint
        self.armed = False
        self.calls = 0
        self._seconds = 0.0  # host: this step's wait so far
        self._use_rq = run_queue and not cuda
        self._rq: RunQueueDelay | None = None
        self._rq_thread: int | None = None
        self._rq_step: float | None = None  # run-queue delay when the step was armed
        self._rq_enter = 0.0
        self._rq_in = 0.0  # run-queue delay inside this step's timed calls
        self._pairs: list[tuple[Any, Any]] = []  # cuda: this step's event pairs
        self._steps: list[Any] = []  # per completed step: seconds (host) or its pairs (cuda)
        self._desched: list[float] = []
        self._desched_in: list[float] = []
        self._free: list[Any] = []
        self._backward_ends: list[float] = []  # this step's DDP backwards (see .ddp)
        self._completed: list[tuple[int, float]] = []

    def arm(self) -> None:
        """A step begins: time the calls from now on."""
        if self._use_rq:
            if self._rq_thread != threading.get_ident():
                self.close()
                self._rq, self._rq_thread = RunQueueDelay(), threading.get_ident()
            self._rq_step = self._rq.seconds() if self._rq.available else None
        if self.fingerprint:
            _calls.step_begin()
        self.armed = True

    def enter(self) -> Any:
        if self.cuda:
            return self._event()
        if self._rq is not None:
            self._rq_enter = self._rq.seconds()
        return time.perf_counter()

    def leave(self, start: Any) -> None:
        self.calls += 1
        if self.cuda:
            self._pairs.append((start, self._event()))
        else:
            self._seconds += time.perf_counter() - start
            if self._rq is not None:
                self._rq_in += self._rq.seconds() - self._rq_enter

    def async_launched(self, last: bool) -> int:
        """A DDP bucket's all-reduce was launched in this step (``last``: the backward's last
        bucket, the end of its compute); returns the backward's index for its completion."""
        self.calls += 1
        index = len(self._backward_ends)
        if last:
            self._backward_ends.append(time.perf_counter())
        return index

    def async_completed(self, backward: int) -> None:
        """A bucket of that backward completed (called on the thread that completed it)."""
        self._completed.append((backward, time.perf_counter()))

    def step_done(self, completed: bool = True) -> None:
        """Close the step's account: kept when the step completed, dropped when it was aborted."""
        self.armed = False
        if self.fingerprint:
            _calls.step_end(completed)
        if self._completed:
            self._seconds += ddp.blocked_tails(self._backward_ends, self._completed)
        self._backward_ends, self._completed = [], []
        if completed:
            self._steps.append(self._pairs if self.cuda else self._seconds)
            desched = 0.0
            if self._rq is not None and self._rq_step is not None:
                desched = max(0.0, self._rq.seconds() - self._rq_step - self._rq_in)
            self._desched.append(desched)
            self._desched_in.append(self._rq_in if self._rq is not None else 0.0)
        else:
            self._free += (e for pair in self._pairs for e in pair)
        self._seconds, self._pairs, self._rq_step, self._rq_in = 0.0, [], None, 0.0

    def take_calls(self) -> int:
        """The calls counted since the last take (the log window's, at the log step)."""
        calls, self.calls = self.calls, 0
        return calls

    def drain(self) -> StepWaits:
        """The steps completed since the last drain (called at the log step; on CUDA after the
        step timer's one synchronisation)."""
        steps, self._steps = self._steps, []
        desched, self._desched = self._desched, []
        inside, self._desched_in = self._desched_in, []
        if not self.cuda:
            return StepWaits(steps, desched, inside)
        if steps and steps[-1]:
            steps[-1][-1][1].synchronize()  # done already: the step's stream waited for it
        out = []
        for pairs in steps:
            out.append(sum(float(a.elapsed_time(b)) for a, b in pairs) / 1000.0)
            self._free += (e for pair in pairs for e in pair)
        return StepWaits(out, desched, inside)

    def close(self) -> None:
        if self._rq is not None:
            self._rq.close()
            self._rq, self._rq_thread = None, None

    def _event(self) -> Any:
        if self._free:
            event = self._free.pop()
        else:
            import torch

            event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event


_calls = Calls()


def activate(timer: CollectiveTimer | None) -> None:
    """Make ``timer`` the one the wrapper feeds (None: nothing is timed); wraps on first use."""
    if timer is not None:
        install()
    _calls.timer = timer


def active() -> CollectiveTimer | None:
    return _calls.timer


def last_entered() -> tuple[str, int] | None:
    """(op, seq) of the last collective this process entered; None before the first."""
    op, seq = _calls.op, _calls.seq
    return None if op is None else (op, seq)


def progress() -> tuple[int, int, bool]:
    """(last entered seq, last completed seq, inside a collective now): the progress evidence
    the heartbeat publishes (read on another thread: each field is one store, a torn pair only
    says a call was entered or left in between)."""
    calls = _calls
    return calls.seq, calls.done, calls.depth > 0


def entered_call() -> tuple[int, int, int, int]:
    """(op code, elements, dtype code, off the previous step's pattern) of the last collective
    entered: what a waiting rank waits in (read on another thread, like ``progress``)."""
    calls = _calls
    return calls.code, calls.elems, calls.dtype, calls.off_pattern


def last_step() -> tuple[int, int, int] | None:
    """(collectives, fingerprint, sequence number at its end) of the last completed step."""
    return _calls.last_step


def last_break() -> Break | None:
    """The last completed step's first call off its pattern (fingerprint.Break), kept until
    another step breaks it; None before any did."""
    return _calls.last_break


def wrap(name: str | None, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` numbered as collective ``name`` (None: not numbered) and timed while armed."""
    code = OP_CODES.get(name or "", 0)
    keyed, sized = name not in POINT_TO_POINT, name not in UNEVEN
    group_at = GROUP_AT.get(name or "", 0)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls = _calls
        if calls.depth:  # only the outermost call: all_gather_object calls all_gather
            return fn(*args, **kwargs)
        seq, timer = calls.seq, calls.timer
        if name is not None:
            seq += 1
            calls.op, calls.seq = name, seq
            calls.note(code, args or by_keyword(kwargs),
                       keyed and timer is not None and timer.armed, sized,
                       args[group_at] if len(args) > group_at else kwargs.get("group"))
        calls.depth = 1
        try:
            if timer is None or not timer.armed or kwargs.get("async_op"):
                return fn(*args, **kwargs)
            start = timer.enter()
            try:
                return fn(*args, **kwargs)
            finally:
                timer.leave(start)
        finally:
            calls.depth = 0
            calls.done = seq  # left, returned or raised: no longer waited for here

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def install() -> bool:
    """Wrap the collectives once per process (idempotent; the wrapper only numbers calls while
    no timer is armed); False without torch.distributed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    if not dist.is_available():
        return False
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed import distributed_c10d as c10d

    know_tensors()

    for module in (dist, c10d):
        for name in C10D_NAMES:
            fn = getattr(module, name, None)
            if fn is not None and not getattr(fn, _WRAPPED, False):
                setattr(module, name, wrap(name, fn))
    for name, op in PRIVATE_NAMES.items():
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, _WRAPPED, False):
            setattr(dist, name, wrap(op, fn))
    if not getattr(funcol.wait_tensor, _WRAPPED, False):
        funcol.wait_tensor = wrap(None, funcol.wait_tensor)
    ddp.watch(active)
    return True
