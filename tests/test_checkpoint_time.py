"""The checkpoint clock: a save's wall time, its own work (less the waits in collectives) and its
share of the time, served by the monitor until the next save. Two ranks waiting for each other
are tested end to end (tests/test_e2e_checkpoint_diagnose.py); here one process."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from fsdpmon import catalog
from fsdpmon.monitor import Monitor, MonitorConfig, collectives
from fsdpmon.monitor.checkpoint_time import PHASE, CheckpointClock
from fsdpmon.monitor.collectives import CollectiveTimer

SAVE_S = 0.2
TRAIN_S = 0.3


def test_a_save_is_timed_with_its_share_and_served_until_the_next(tmp_path):
    mon = Monitor(MonitorConfig(port=0, job_name="ckpt", state_dir=str(tmp_path / "state"),
                                      listen_address="127.0.0.1"))
    try:
        with mon.step():
            time.sleep(TRAIN_S)
        with mon.phase(PHASE):
            time.sleep(SAVE_S)
        values = mon.pub.snapshot["values"]
        wall = values[catalog.TRAIN_CHECKPOINT_SECONDS.name]
        own = values[catalog.TRAIN_CHECKPOINT_OWN_SECONDS.name]
        ratio = values[catalog.TRAIN_CHECKPOINT_TIME_RATIO.name]
        assert SAVE_S <= wall < SAVE_S + 0.1, wall
        assert own == wall, (own, wall)  # one process waits for nobody
        # the save over the time since the first step began (train + save), give or take the
        # clock reads between them
        expected = SAVE_S / (SAVE_S + TRAIN_S)
        assert ratio == pytest.approx(expected, abs=0.08), (ratio, expected)
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
        dist.barrier()  # the wrapped entry point: timed as a wait, however short
        times = clock.end()
        assert times is not None
        assert times.own_seconds <= times.seconds, times
        assert times.seconds - times.own_seconds < 0.05, times  # a 1-rank barrier: ~no wait
        assert collectives.active() is step_timer, "the step's timer is active again"
        leaked = step_timer.drain().collective
        assert leaked == [] and step_timer.calls == 0, f"the save's waits leaked: {leaked}"
        assert clock.end() is None  # no save open
    finally:
        collectives.activate(None)
        dist.destroy_process_group()
