"""The per-rank state files the pod's endpoint is served from."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from fsdpmon.monitor.heartbeat import HB_POSITION, HB_RECORD
from fsdpmon.monitor.state import (
    RankStateWriter,
    job_state_dir,
    pid_alive,
    read_heartbeat,
    read_job_states,
)
from fsdpmon.monitor.statedir import live_pids


def _snapshot(rank: int, pid: int | None = None) -> dict:
    return {"pid": pid or os.getpid(), "rank": rank, "local_rank": rank, "job_name": "j"}


def test_heartbeat_and_snapshot_round_trip(tmp_path):
    job_dir = tmp_path / "job"
    writer = RankStateWriter(job_dir, 1)
    writer.snapshot(_snapshot(1))
    writer.heartbeat(1700000000.5, 12, 10, 40960, 0.0, 120.0, 1700000001.0)
    [state] = read_job_states(job_dir)
    assert state.rank == 1
    hb = state.heartbeat
    assert (hb.pid, hb.last_step_unix, hb.step, hb.steps_total, hb.tokens_total) == (
        os.getpid(), 1700000000.5, 12, 10, 40960)
    assert (hb.stalled, hb.stall_threshold, hb.watchdog_unix) == (0.0, 120.0, 1700000001.0)
    writer.close()
    assert read_job_states(job_dir) == []
    assert not job_dir.exists()  # the last rank out removes the directory


def test_a_closed_writer_publishes_nothing_and_raises_nothing(tmp_path):
    """A SIGTERM's clean-up closes the writer on whichever thread gets there; the watchdog's
    next heartbeat or a log step's snapshot must neither raise nor bring the files back."""
    job_dir = tmp_path / "job"
    writer = RankStateWriter(job_dir, 0)
    writer.snapshot(_snapshot(0))
    writer.close()
    writer.heartbeat(2.0, 2, 2, 2, 1.0, 1.0)
    writer.snapshot(_snapshot(0))
    assert not job_dir.exists(), list(job_dir.iterdir())


def test_torn_heartbeat_is_not_trusted(tmp_path):
    writer = RankStateWriter(tmp_path, 0)
    writer.heartbeat(1.0, 1, 1, 1, 0, 1)
    raw = bytearray(writer.hb_path.read_bytes())
    raw[0] ^= 0xFF  # the leading sequence number no longer matches the trailing one
    writer.hb_path.write_bytes(bytes(raw))
    assert read_heartbeat(writer.hb_path) is None


def test_dead_and_zombie_ranks_are_dropped_and_their_files_removed(tmp_path):
    exited = subprocess.Popen(["true"])
    exited.wait()  # reaped: the PID is gone
    zombie = subprocess.Popen(["true"])
    try:
        zombie_pid = zombie.pid
        for _ in range(200):  # until it has exited (but is not reaped)
            if not pid_alive(zombie_pid):
                break
            os.sched_yield()
        assert not pid_alive(exited.pid)
        assert not pid_alive(zombie_pid)
        for rank, pid in ((0, os.getpid()), (1, exited.pid), (2, zombie_pid)):
            writer = RankStateWriter(tmp_path, rank)
            writer.pid = pid
            writer.heartbeat(1.0, 1, 1, 1, 0, 1)
            writer.snapshot(_snapshot(rank, pid))
        assert [s.rank for s in read_job_states(tmp_path)] == [0]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.hb", "rank0.json"]
        for rank, pid in ((1, exited.pid), (2, zombie_pid)):  # died after the last scrape
            writer = RankStateWriter(tmp_path, rank)
            writer.pid = pid
            writer.heartbeat(1.0, 1, 1, 1, 0, 1)
            writer.snapshot(_snapshot(rank, pid))
        RankStateWriter(tmp_path, 0).close()  # the last live rank leaves: nothing remains
        assert not tmp_path.exists(), list(tmp_path.iterdir())
    finally:
        zombie.wait()


def test_garbage_files_are_skipped(tmp_path):
    (tmp_path / "rank0.json").write_text("{not json")
    (tmp_path / "rank1.json").write_text(json.dumps([1, 2]))
    (tmp_path / "rank2.json").write_text(json.dumps(_snapshot(2)))  # no heartbeat file
    assert read_job_states(tmp_path) == []
    assert read_job_states(tmp_path / "missing") == []


def test_state_dir_is_per_job_and_port(tmp_path):
    a = job_state_dir("llama/7b run", 9520, str(tmp_path))
    assert a.parent == tmp_path
    assert "/" not in a.name[len("fsdpmon-"):] and " " not in a.name
    assert a != job_state_dir("llama/7b run", 9521, str(tmp_path))
    assert a != job_state_dir("other", 9520, str(tmp_path))


def test_the_last_rank_out_removes_what_dead_writers_left_half_written(tmp_path):
    """A rank killed between writing a file and renaming it into place (or stopped by SIGTERM,
    whose clean-up runs on the thread it interrupted mid-write) leaves a half-written file:
    the last rank out removes those of processes that are gone, and the directory goes; a live
    process's write in progress is left alone."""
    exited = subprocess.Popen(["true"])
    exited.wait()  # reaped: the PID is gone
    job_dir = tmp_path / "job"
    writer = RankStateWriter(job_dir, 0)
    writer.snapshot(_snapshot(0))
    for name in (f".rank1.json.{exited.pid}", f".rank1.hb.{exited.pid}",
                 f".rank1.exit.{exited.pid}", f".rank0.json.{os.getpid()}"):
        (job_dir / name).write_bytes(b"{half")
    live = subprocess.Popen(["sleep", "30"])
    try:
        (job_dir / f".rank2.json.{live.pid}").write_bytes(b"{half")
        writer.close()
        left = sorted(p.name for p in job_dir.iterdir())
        assert left == [f".rank2.json.{live.pid}"], left
    finally:
        live.kill()
        live.wait()
    RankStateWriter(job_dir, 3).close()  # its writer is gone now: the next last rank out
    assert not job_dir.exists(), list(job_dir.iterdir())


def _tear(path) -> None:
    """As a writer SIGKILLed between the record's parts leaves it: the record at seq 2, the
    position still at 1 (torn for good)."""
    raw = bytearray(path.read_bytes())
    raw[HB_RECORD.size:HB_RECORD.size + HB_POSITION.size] = HB_POSITION.pack(0, 0, 0, -1, 0, 1)
    path.write_bytes(bytes(raw))
    assert read_heartbeat(path) is None


@pytest.mark.parametrize("torn", [False, True], ids=["whole", "torn"])
def test_the_last_rank_out_removes_a_dead_ranks_lone_heartbeat_torn_or_not(tmp_path, torn):
    """A rank stopped during start-up, after its heartbeat and before its first snapshot
    (issue 52's leftover: ``rank1.hb`` alone), or SIGKILLed in the middle of a heartbeat (a CI
    run left ``rank1.hb`` so, torn for good: unreadable, yet its pid says whether its writer
    runs): the last rank out removes it by its pid; a live rank's lone heartbeat stays."""
    exited = subprocess.Popen(["true"])
    exited.wait()  # reaped: the PID is gone
    live = subprocess.Popen(["sleep", "30"])
    job_dir = tmp_path / "job"
    try:
        for rank, pid in ((1, exited.pid), (2, live.pid)):
            lone = RankStateWriter(job_dir, rank)  # a heartbeat, no snapshot
            lone.pid = pid
            lone.heartbeat(1.0, 1, 1, 1, 0, 1)
            if torn:
                _tear(lone.hb_path)
        assert live_pids(job_dir) == {"rank2.hb": live.pid}
        RankStateWriter(job_dir, 0).close()
        left = sorted(p.name for p in job_dir.iterdir())
        assert left == ["rank2.hb"], left
    finally:
        live.kill()
        live.wait()
