"""The checkpoint clock: a save's wall time, its own work (less the waits in collectives) and its
share of the time, served by the monitor until the next save. Two ranks waiting for each other
are tested end to end (tests/test_e2e_diagnose.py: rank 1's slow saves, named as the rank rank 0
waited for); here one process. Each figure is bracketed by clock reads of the test's own around
what it times: exact lower bounds (a sleep sleeps at least that long), upper bounds from the
brackets, never a constant."""

from __future__ import annotations

import time

import torch.distributed as dist

from fsdpmon import catalog
from fsdpmon.conventions import CHECKPOINT_PHASE
from fsdpmon.monitor import Monitor, MonitorConfig, collectives
from fsdpmon.monitor.checkpoint_time import CheckpointClock
from fsdpmon.monitor.collectives import CollectiveTimer

SAVE_S = 0.2
TRAIN_S = 0.3


def test_a_save_is_timed_with_its_share_and_served_until_the_next(tmp_path):
    mon = Monitor(MonitorConfig(port=0, job_name="ckpt", state_dir=str(tmp_path / "state"),
                                      listen_address="127.0.0.1"))
    try:
        step_begun = time.perf_counter()
        with mon.step():
            time.sleep(TRAIN_S)
        save_begun = time.perf_counter()
        with mon.phase(CHECKPOINT_PHASE):
            time.sleep(SAVE_S)
        save_done = time.perf_counter()
        values = mon.pub.snapshot["values"]
        wall = values[catalog.TRAIN_CHECKPOINT_SECONDS.name]
        own = values[catalog.TRAIN_CHECKPOINT_OWN_SECONDS.name]
        ratio = values[catalog.TRAIN_CHECKPOINT_TIME_RATIO.name]
        assert SAVE_S <= wall <= save_done - save_begun, (wall, save_done - save_begun)
        assert own == wall, (own, wall)  # one process waits for nobody
        # the share is the save over the time since the first step began: that span holds
        # the training and the save, and lies inside the test's own reads around both
        span = wall / ratio
        assert TRAIN_S + SAVE_S <= span <= save_done - step_begun, (
            f"share {ratio:.4f} of a {wall:.4f} s save means a {span:.4f} s span, outside "
            f"{TRAIN_S + SAVE_S}..{save_done - step_begun:.4f} s")
        with mon.step():
            pass
        assert mon.pub.snapshot["values"][catalog.TRAIN_CHECKPOINT_SECONDS.name] == wall
    finally:
        mon.close()


def test_waits_in_collectives_during_a_save_are_not_own_work(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    step_timer = CollectiveTimer()
    collectives.activate(step_timer)
    try:
        clock = CheckpointClock(distributed=True)
        clock.training_started()
        clock.begin()
        time.sleep(SAVE_S)
        barrier_begun = time.perf_counter()
        dist.barrier()  # the wrapped entry point: timed as a wait, however short
        barrier_s = time.perf_counter() - barrier_begun
        times = clock.end()
        assert times is not None
        waited = times.seconds - times.own_seconds
        # the barrier's time is the wait (no more than the test's reads around it), the sleep
        # before it the save's own work
        assert 0 <= waited <= barrier_s and times.own_seconds >= SAVE_S, (times, barrier_s)
        assert collectives.active() is step_timer, "the step's timer is active again"
        leaked = step_timer.drain().collective
        assert leaked == [] and step_timer.calls == 0, f"the save's waits leaked: {leaked}"
        assert clock.end() is None  # no save open
    finally:
        collectives.activate(None)
        dist.destroy_process_group()
