"""The trainer's fault hooks do what the spec says, on the rank it names, and nothing otherwise.
(End to end under torchrun: tests/test_e2e_straggler.py, tests/test_e2e_training.py.)"""

from __future__ import annotations

import math
import threading

import pytest
import torch

import fsdpmon.trainer.faults as faults
from fsdpmon import faultspec as fs
from fsdpmon.trainer.faults import FaultPlan


def plan(spec: str, rank: int = 1, world: int = 2) -> FaultPlan:
    return FaultPlan.for_rank(fs.parse(spec), rank, world)


class FakeTime:
    """fsdpmon.trainer.faults' clock: a sleep is recorded and moves the clock on, nothing waits; so
    what each hook slept is exact, and no bound depends on how loaded the machine is."""

    def __init__(self) -> None:
        self.now, self.slept = 0.0, []  # from 0: "first step + after" is exact

    def monotonic(self) -> float:
        return self.now

    perf_counter = process_time = monotonic

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def take(self) -> list[float]:
        out, self.slept = self.slept, []
        return out


@pytest.fixture
def clock(monkeypatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(faults, "time", fake)
    return fake


def test_an_empty_plan_leaves_everything_alone(clock):
    empty = plan("compute-slow:rank=0,factor=3")  # aimed at rank 0, we are rank 1
    loader = iter([1, 2])
    assert empty.faults == () and empty.wrap_loader(loader, lambda: 0) is loader
    loss = torch.tensor(2.0)
    assert empty.loss(10, loss) is loss
    empty.slow_compute(10, 1.0)
    empty.after_step(10)
    empty.in_save(10)
    assert clock.take() == []


def test_compute_slow_sleeps_factor_minus_one_times_the_phase_from_its_step(clock):
    p = plan("compute-slow:rank=1,factor=1.5,from_step=3")
    p.slow_compute(2, 0.2)  # before from_step: nothing
    assert clock.take() == []
    p.slow_compute(3, 0.2)
    assert clock.take() == [(1.5 - 1) * 0.2]


def test_checkpoint_slow_lengthens_the_saves_from_its_step(clock):
    p = plan("checkpoint-slow:rank=1,seconds=0.1,from_step=40")
    p.in_save(20)  # a save before from_step: nothing
    assert clock.take() == []
    p.in_save(40)
    assert clock.take() == [0.1]


def test_after_counts_from_the_ranks_first_step(clock):
    p = plan("compute-slow:rank=1,factor=2,after=0.2;checkpoint-slow:rank=1,seconds=0.1,after=0.2")
    p.slow_compute(5, 0.1)  # no step completed yet: not due
    first = clock.now
    p.after_step(1)
    p.slow_compute(5, 0.1)  # 0 s after the first step
    p.in_save(5)
    clock.now = first + 0.2 - 1e-6
    p.after_step(2)  # the first step stays the first
    p.slow_compute(5, 0.1)  # just short of 0.2 s
    assert clock.take() == []
    clock.now = first + 0.2
    p.slow_compute(5, 0.1)
    p.in_save(5)
    assert clock.take() == [(2 - 1) * 0.1, 0.1]


def test_data_slow_adds_seconds_per_batch_and_keeps_the_loader_state(clock):
    class Loader:
        position = 0

        def __next__(self):
            self.position += 1
            return self.position

    inner = Loader()
    steps_done = [0]
    wrapped = plan("data-slow:rank=1,seconds=0.05,from_step=2").wrap_loader(
        inner, lambda: steps_done[0])
    assert next(wrapped) == 1  # batch of step 1: before from_step
    assert clock.take() == []
    steps_done[0] = 1
    assert next(wrapped) == 2
    assert clock.take() == [0.05]
    wrapped.position = 7  # a resume sets the real loader's position through the wrapper
    assert inner.position == 7 and wrapped.position == 7


def test_hang_in_the_data_loader_never_returns():
    steps_done = [3]
    wrapped = plan("hang:rank=1,at_step=3,where=data").wrap_loader(iter([1]), lambda: steps_done[0])
    thread = threading.Thread(target=lambda: next(wrapped), daemon=True)
    thread.start()
    thread.join(1.5)  # it never returns: how long this waits only bounds how late a bug shows
    assert thread.is_alive(), "next(loader) returned although the rank should hang"


class Hung(Exception):
    pass


def test_a_hang_with_after_waits_for_its_time_then_blocks_at_the_next_step(clock, monkeypatch):
    def hang() -> None:
        raise Hung

    monkeypatch.setattr(faults, "hang_in_data_loader", hang)
    monkeypatch.setattr(faults, "block_forever_in_host_call", hang)
    p = plan("hang:rank=1,at_step=3,where=data,after=0.3")
    steps_done = [5]
    wrapped = p.wrap_loader(iter([1, 2, 3]), lambda: steps_done[0])
    assert next(wrapped) == 1, "no step completed yet: not due"
    first = clock.now
    p.after_step(1)  # the rank's first step: 0.3 s from now
    clock.now = first + 0.3 - 1e-6
    assert next(wrapped) == 2, "past at_step but not yet 0.3 s after the first step"
    clock.now = first + 0.3
    with pytest.raises(Hung):
        next(wrapped)
    host = plan("hang:rank=1,at_step=3,where=host,after=3600")
    host.after_step(1)
    host.after_step(3)  # at its step, but an hour early: returns (a host hang would block)
    host.after_step(4)
    clock.now += 3600
    with pytest.raises(Hung):
        host.after_step(5)
    at_step = plan("hang:rank=1,at_step=3,where=host")
    at_step.after_step(2)
    with pytest.raises(Hung):
        at_step.after_step(3)


def test_a_gated_hang_blocks_at_the_first_step_past_at_step_once_its_file_exists(
        tmp_path, monkeypatch):
    def hang() -> None:
        raise Hung

    monkeypatch.setattr(faults, "hang_in_data_loader", hang)
    monkeypatch.setattr(faults, "block_forever_in_host_call", hang)
    gate = tmp_path / "hang.gate"
    data = plan(f"hang:rank=1,at_step=3,where=data,gate={gate}")
    steps_done = [2]
    wrapped = data.wrap_loader(iter([1, 2, 3, 4]), lambda: steps_done[0])
    gate.touch()
    assert next(wrapped) == 1, "gate open but before at_step: not due"
    gate.unlink()
    steps_done[0] = 5
    assert next(wrapped) == 2, "past at_step, the gate not yet there: not due"
    gate.touch()
    with pytest.raises(Hung):
        next(wrapped)
    host = plan(f"hang:rank=1,at_step=3,where=host,gate={gate}")
    gate.unlink()
    host.after_step(4)  # past its step, no gate: returns
    gate.touch()
    with pytest.raises(Hung):
        host.after_step(5)


def test_nonfinite_loss_from_its_step():
    p = plan("nonfinite-loss:rank=1,from_step=4,value=-inf")
    loss = torch.tensor(2.5)
    assert p.loss(3, loss) is loss
    assert p.loss(4, loss).item() == -math.inf
    assert math.isnan(plan("nonfinite-loss:rank=1").loss(0, loss).item())
