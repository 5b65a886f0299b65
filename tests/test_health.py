"""Alerts and the job state from a snapshot: precedence and thresholds."""

from __future__ import annotations

from dataclasses import replace

from fsdpmon.top.health import MEMORY_PRESSURE_RATIO, STRAGGLER_RATIO, alerts, job_state
from fsdpmon.top.snapshot import GpuRow, JobSnapshot, JobState, RankRow, TargetStatus

UP, DOWN = TargetStatus("http://a/metrics", "train", True), TargetStatus("http://b", "", False)


def snap(**kw) -> JobSnapshot:
    base = JobSnapshot(time=0.0, source="t", targets=(UP,),
                       ranks=(RankRow(rank=0, step=5), RankRow(rank=1, step=5)))
    return replace(base, **kw)


def state(s: JobSnapshot, previous: JobSnapshot | None = None) -> JobState:
    return job_state(replace(s, alerts=tuple(alerts(s))), previous)


def test_precedence():
    stalled = (RankRow(rank=0, step=5, stalled=True), RankRow(rank=1, step=5))
    assert state(snap()) is JobState.RUNNING
    assert state(snap(targets=(UP, DOWN))) is JobState.DEGRADED
    assert state(snap(targets=(UP, DOWN), ranks=stalled)) is JobState.STALLED
    assert state(snap(total_steps=5, targets=(UP, DOWN))) is JobState.DONE
    assert state(snap(targets=(DOWN,))) is JobState.DOWN
    done = replace(snap(), state=JobState.DONE)
    assert state(snap(targets=(DOWN,)), previous=done) is JobState.DONE


def test_straggler_threshold_is_relative_to_the_median():
    just_under = snap(slowest_rank=1, step_time_median_s=1.0,
                      step_time_max_s=STRAGGLER_RATIO * 0.99)
    over = replace(just_under, step_time_max_s=STRAGGLER_RATIO * 1.01)
    assert not [a for a in alerts(just_under) if a.kind == "straggler"]
    assert [a.message for a in alerts(over) if a.kind == "straggler"] == [
        "rank 1 straggles: step 1.21s vs median 1s"]


def test_memory_pressure_and_lost_gpu():
    full = GpuRow(node="n", gpu="0", memory_used_bytes=MEMORY_PRESSURE_RATIO * 80,
                  memory_total_bytes=80)
    lost = GpuRow(node="n", gpu="1", up=False)
    kinds = {a.kind for a in alerts(snap(gpus=(full, lost)))}
    assert kinds == {"memory_pressure", "gpu_down"}
    many = tuple(RankRow(rank=r, stalled=True) for r in range(12))
    stall = next(a for a in alerts(snap(ranks=many)) if a.kind == "stall")
    assert "rank 0, 1, 2, 3, 4, 5, 6, 7 (+4 more) stalled" in stall.message
