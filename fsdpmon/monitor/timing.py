"""Step and phase timing without device synchronisation on non-log steps.

On CPU every mark is the wall clock. On CUDA the step and the device phases (forward, backward,
optimizer) are bracketed by CUDA events recorded on the current stream — recording is
asynchronous — and the events are only read on log steps, after one ``synchronize`` of the
window's last event. Host-bound phases (data loading, checkpointing) are host wall time on both.
Events are pooled, so a steady-state step allocates none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

HOST_PHASES = frozenset({"data", "checkpoint"})


class HostClock:
    device = "cpu"

    def mark(self) -> Any:
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        return float(end - start)

    def wait(self, mark: Any) -> None:
        pass

    def release(self, marks: list[Any]) -> None:
        pass


class CudaClock:
    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._free: list[Any] = []
        self.device = torch.cuda.get_device_name()

    def mark(self) -> Any:
        event = self._free.pop() if self._free else self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000.0

    def wait(self, mark: Any) -> None:
        mark.synchronize()

    def release(self, marks: list[Any]) -> None:
        self._free.extend(marks)


@dataclass
class WindowTimes:
    """What one log window measured."""

    step_seconds: list[float] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=dict)


class StepTimer:
    """Collects marks during a window; ``drain`` resolves them (the one sync per window)."""

    def __init__(self, clock: HostClock | CudaClock) -> None:
        self.clock = clock
        self._steps: list[tuple[Any, Any]] = []
        self._phases: list[tuple[str, Any, Any]] = []
        self._host_phase: dict[str, float] = {}
        self._step_start: Any = None
        self._open: dict[str, Any] = {}
        self.host_step_start = 0.0

    def begin_step(self) -> None:
        self.host_step_start = time.perf_counter()
        self._step_start = self.clock.mark()

    def end_step(self) -> float:
        """Close the step; returns its host wall duration (for the stall watchdog)."""
        self._steps.append((self._step_start, self.clock.mark()))
        self._step_start = None
        return time.perf_counter() - self.host_step_start

    def abort_step(self) -> None:
        self._step_start = None  # a pooled CUDA event is simply not returned: rare path

    @property
    def in_step(self) -> bool:
        return self._step_start is not None

    def begin_phase(self, name: str) -> None:
        if name in HOST_PHASES or isinstance(self.clock, HostClock):
            self._open[name] = time.perf_counter()
        else:
            self._open[name] = self.clock.mark()

    def end_phase(self, name: str) -> None:
        start = self._open.pop(name, None)
        if start is None:
            return
        if isinstance(start, float):
            self._host_phase[name] = self._host_phase.get(name, 0.0) + time.perf_counter() - start
        else:
            self._phases.append((name, start, self.clock.mark()))

    def drain(self) -> WindowTimes:
        """Resolve the window's marks (waiting for the last device event) and start a new one."""
        times = WindowTimes(phase_seconds=dict(self._host_phase))
        for last in (self._steps[-1][1] if self._steps else None,
                     self._phases[-1][2] if self._phases else None):
            if last is not None:
                self.clock.wait(last)
        used: list[Any] = []
        for start, end in self._steps:
            times.step_seconds.append(self.clock.seconds(start, end))
            used += (start, end)
        for name, start, end in self._phases:
            times.phase_seconds[name] = times.phase_seconds.get(name, 0.0) + self.clock.seconds(
                start, end)
            used += (start, end)
        self.clock.release(used)
        self._steps, self._phases, self._host_phase = [], [], {}
        return times
