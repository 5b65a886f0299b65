"""The trainer's fault hooks do what the spec says, on the rank it names, and nothing otherwise.
(End to end under torchrun: tests/test_e2e_straggler.py, tests/test_e2e_training.py.)"""

from __future__ import annotations

import math
import threading
import time

import torch

from fsdpmon import faultspec as fs
from trainer.faults import FaultPlan


def plan(spec: str, rank: int = 1, world: int = 2) -> FaultPlan:
    return FaultPlan.for_rank(fs.parse(spec), rank, world)


def test_an_empty_plan_leaves_everything_alone():
    empty = plan("compute-slow:rank=0,factor=3")  # aimed at rank 0, we are rank 1
    loader = iter([1, 2])
    assert empty.faults == () and empty.wrap_loader(loader, lambda: 0) is loader
    loss = torch.tensor(2.0)
    assert empty.loss(10, loss) is loss
    started = time.perf_counter()
    empty.slow_compute(10, 1.0)
    empty.after_step(10)
    empty.in_save(10)
    assert time.perf_counter() - started < 0.05


def test_compute_slow_sleeps_factor_minus_one_times_the_phase_from_its_step():
    p = plan("compute-slow:rank=1,factor=1.5,from_step=3")
    started = time.perf_counter()
    p.slow_compute(2, 0.2)  # before from_step: nothing
    assert time.perf_counter() - started < 0.05
    started = time.perf_counter()
    p.slow_compute(3, 0.2)
    slept = time.perf_counter() - started
    assert 0.1 <= slept < 0.1 + 0.1, f"slept {slept:.3f} s for 0.5 x 0.2 s"


def test_checkpoint_slow_lengthens_the_saves_from_its_step():
    p = plan("checkpoint-slow:rank=1,seconds=0.1,from_step=40")
    started = time.perf_counter()
    p.in_save(20)  # a save before from_step: nothing
    assert time.perf_counter() - started < 0.05
    started = time.perf_counter()
    p.in_save(40)
    slept = time.perf_counter() - started
    assert 0.1 <= slept < 0.1 + 0.1, f"slept {slept:.3f} s for 0.1 s"


def test_after_counts_from_the_ranks_first_step():
    p = plan("compute-slow:rank=1,factor=2,after=0.2;checkpoint-slow:rank=1,seconds=0.1,after=0.2")
    started = time.perf_counter()
    p.slow_compute(5, 0.1)  # no step completed yet: not due
    p.after_step(1)
    p.slow_compute(5, 0.1)  # 0 s after the first step
    p.in_save(5)
    assert time.perf_counter() - started < 0.05
    time.sleep(0.2)
    p.after_step(2)  # the first step stays the first
    started = time.perf_counter()
    p.slow_compute(5, 0.1)
    p.in_save(5)
    slept = time.perf_counter() - started
    assert 0.2 <= slept < 0.2 + 0.1, f"slept {slept:.3f} s for 0.1 + 0.1 s"


def test_data_slow_adds_seconds_per_batch_and_keeps_the_loader_state():
    class Loader:
        position = 0

        def __next__(self):
            self.position += 1
            return self.position

    inner = Loader()
    steps_done = [0]
    wrapped = plan("data-slow:rank=1,seconds=0.05,from_step=2").wrap_loader(
        inner, lambda: steps_done[0])
    started = time.perf_counter()
    assert next(wrapped) == 1  # batch of step 1: before from_step
    assert time.perf_counter() - started < 0.04
    steps_done[0] = 1
    started = time.perf_counter()
    assert next(wrapped) == 2
    assert time.perf_counter() - started >= 0.05
    wrapped.position = 7  # a resume sets the real loader's position through the wrapper
    assert inner.position == 7 and wrapped.position == 7


def test_hang_in_the_data_loader_never_returns():
    steps_done = [3]
    wrapped = plan("hang:rank=1,at_step=3,where=data").wrap_loader(iter([1]), lambda: steps_done[0])
    thread = threading.Thread(target=lambda: next(wrapped), daemon=True)
    thread.start()
    thread.join(1.5)
    assert thread.is_alive(), "next(loader) returned although the rank should hang"


def test_a_hang_with_after_waits_for_its_time_then_blocks_at_the_next_step():
    p = plan("hang:rank=1,at_step=3,where=data,after=0.3")
    steps_done = [5]
    wrapped = p.wrap_loader(iter([1, 2, 3]), lambda: steps_done[0])
    assert next(wrapped) == 1, "no step completed yet: not due"
    p.after_step(1)  # the rank's first step: 0.3 s from now
    assert next(wrapped) == 2, "past at_step but not yet 0.3 s after the first step"
    time.sleep(0.3)
    thread = threading.Thread(target=lambda: next(wrapped), daemon=True)
    thread.start()
    thread.join(1.5)
    assert thread.is_alive(), "next(loader) returned although the rank should hang by now"
    host = plan("hang:rank=1,at_step=3,where=host,after=3600")
    host.after_step(1)
    host.after_step(3)  # at its step, but an hour early: returns (a host hang would block)
    host.after_step(4)


def test_nonfinite_loss_from_its_step():
    p = plan("nonfinite-loss:rank=1,from_step=4,value=-inf")
    loss = torch.tensor(2.5)
    assert p.loss(3, loss) is loss
    assert p.loss(4, loss).item() == -math.inf
    assert math.isnan(plan("nonfinite-loss:rank=1").loss(0, loss).item())
