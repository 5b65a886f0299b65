"""The collective timer: time inside blocking collectives, per step, only while a step is open."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from fsdpmon.monitor import collectives
from fsdpmon.monitor.collectives import CollectiveTimer

NAP = 0.02


@pytest.fixture
def timer():
    t = CollectiveTimer()
    collectives.activate(t)
    yield t
    collectives.activate(None)


def napping(*args, async_op: bool = False, **kwargs):
    time.sleep(NAP)


def test_counts_the_time_inside_calls_made_during_a_step(timer):
    wrapped = collectives._timed(napping)
    wrapped()  # between steps: not counted
    timer.armed = True
    wrapped()
    wrapped(async_op=True)  # returns a Work waited on elsewhere: not counted here
    timer.armed = False
    timer.step_done()
    timer.armed = True
    wrapped()
    timer.armed = False
    timer.step_done(completed=False)  # an aborted step is forgotten
    (wait,) = timer.drain()
    # one nap counted; the sleep may overrun by scheduling, never undercut
    assert NAP <= wait < 2 * NAP + 0.05, f"wait {wait:.4f} s for one {NAP} s call"
    assert timer.calls == 2 and timer.drain() == []


def test_a_collective_calling_another_is_counted_once(timer):
    inner = collectives._timed(napping)
    outer = collectives._timed(lambda: (inner(), inner()))
    timer.armed = True
    outer()
    timer.step_done()
    (wait,) = timer.drain()
    assert 2 * NAP <= wait < 4 * NAP + 0.05 and timer.calls == 1, (wait, timer.calls)


def test_install_wraps_the_entry_points_fsdp_and_dtensor_call_once():
    from torch.distributed import _functional_collectives as funcol

    collectives.install()
    first = dist.all_gather_single if hasattr(dist, "all_gather_single") else dist.all_reduce
    collectives.install()  # idempotent
    again = dist.all_gather_single if hasattr(dist, "all_gather_single") else dist.all_reduce
    assert first is again and getattr(first, collectives._WRAPPED)
    assert getattr(dist.distributed_c10d.reduce_scatter_tensor, collectives._WRAPPED)
    assert getattr(funcol.wait_tensor, collectives._WRAPPED)


def test_inactive_wrappers_pass_through():
    collectives.activate(None)
    wrapped = collectives._timed(lambda x, **kw: x + 1)
    assert wrapped(1, async_op=False) == 2
