"""The job state from a snapshot's facts: precedence, and DEGRADED from each fact short of a
stall (never from a verdict: that is the diagnosis' word, tests/test_glance.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fsdpmon.conventions import MEMORY_PRESSURE_RATIO, STRAGGLER_SCORE_THRESHOLD
from fsdpmon.job.health import gone_early, job_state, settle, with_conditions
from fsdpmon.job.snapshot import GpuRow, JobSnapshot, JobState, RankRow, TargetStatus

UP, DOWN = TargetStatus("http://a/metrics", "train", True), TargetStatus("http://b", "", False)


def snap(**kw) -> JobSnapshot:
    base = JobSnapshot(time=0.0, source="t", targets=(UP,),
                       ranks=(RankRow(rank=0, step=5), RankRow(rank=1, step=5)))
    return replace(base, **kw)


def state(s: JobSnapshot, previous: JobSnapshot | None = None) -> JobState:
    return job_state(s, previous)


def test_precedence():
    stalled = (RankRow(rank=0, step=5, stalled=True), RankRow(rank=1, step=5))
    assert state(snap()) is JobState.RUNNING
    assert state(snap(targets=(UP, DOWN))) is JobState.DEGRADED
    assert state(snap(targets=(UP, DOWN), ranks=stalled)) is JobState.STALLED
    assert state(snap(total_steps=5, targets=(UP, DOWN))) is JobState.DONE
    assert state(snap(targets=(DOWN,))) is JobState.DOWN
    finished = tuple(RankRow(rank=i, step=5, down=True) for i in (0, 1))
    assert state(snap(total_steps=5, targets=(DOWN,), ranks=finished)) is JobState.DONE
    early = tuple(RankRow(rank=i, step=3, down=True) for i in (0, 1))
    assert state(snap(total_steps=5, targets=(DOWN,), ranks=early)) is JobState.FAILED
    assert state(snap(targets=(DOWN,), ranks=finished)) is JobState.FAILED  # no plan: not done


GIB = 2**30
AT_LINE = MEMORY_PRESSURE_RATIO * 80 * GIB  # bytes at the pressure line of an 80 GiB device
BELOW = AT_LINE * (1 - 1e-6)
RANK_1 = RankRow(rank=1, step=5)


@pytest.mark.parametrize(("fact", "kw", "degraded"), [
    ("a target down", {"targets": (UP, DOWN)}, True),
    ("a rank gone before its last step", {"ranks": (RankRow(rank=0, step=5),
                                                    replace(RANK_1, down=True))}, True),
    ("a rank gone after its last step", {"ranks": (RankRow(rank=0, step=5),
                                                   replace(RANK_1, down=True, finished=True))},
     False),
    ("a rank never seen", {"world_size": 3}, True),
    ("every rank seen", {"world_size": 2}, False),
    ("a GPU not up", {"gpus": (GpuRow(node="n", gpu="0", up=False),)}, True),
    ("a straggler flagged", {"ranks": (RankRow(rank=0, step=5), replace(
        RANK_1, slowest=True, straggler_score=STRAGGLER_SCORE_THRESHOLD * 0.8))}, True),
    ("slowest without a score", {"ranks": (RankRow(rank=0, step=5),
                                           replace(RANK_1, slowest=True))}, False),
    ("a rank's memory at the line", {"ranks": (RankRow(rank=0, step=5), replace(
        RANK_1, peak_memory_bytes=AT_LINE, memory_capacity_bytes=80 * GIB))}, True),
    ("a rank's memory just below", {"ranks": (RankRow(rank=0, step=5), replace(
        RANK_1, peak_memory_bytes=BELOW, memory_capacity_bytes=80 * GIB))}, False),
    ("a GPU's memory at the line", {"gpus": (GpuRow(
        node="n", gpu="0", memory_used_bytes=AT_LINE, memory_total_bytes=80 * GIB),)}, True),
    ("a GPU's memory just below", {"gpus": (GpuRow(
        node="n", gpu="0", memory_used_bytes=BELOW, memory_total_bytes=80 * GIB),)}, False),
    ("a non-finite loss", {"ranks": (RankRow(rank=0, step=5),
                                     replace(RANK_1, loss=float("nan")))}, True),
    ("the monitor's non-finite flag", {"ranks": (RankRow(rank=0, step=5),
                                                 replace(RANK_1, loss_nonfinite=True))}, True),
    ("a finite loss", {"ranks": (RankRow(rank=0, step=5), replace(RANK_1, loss=2.5))}, False),
])
def test_degraded_follows_each_fact_short_of_a_stall(fact, kw, degraded):
    expected = JobState.DEGRADED if degraded else JobState.RUNNING
    assert state(snap(**kw)) is expected, f"{fact}: {state(snap(**kw))} != {expected}"


def test_a_rank_that_went_away_finished_only_if_it_had_the_time_to():
    # last seen at step 140 of 150 taking 0.05 s a step: it needed 10 x 0.05 = 0.5 s more
    need = (150 - 140) * 0.05
    seen = RankRow(rank=0, step=140, step_time_s=0.05, seen_at=100.0, down=True)
    assert not gone_early(replace(seen, gone_at=100.0 + need * 1.01), 150)
    assert gone_early(replace(seen, gone_at=100.0 + need * 0.99), 150)
    assert not gone_early(replace(seen, step=150, gone_at=100.0), 150)  # seen at its last step
    assert gone_early(replace(seen, gone_at=1e9), None)  # no plan: nothing says it finished
    ranks = tuple(replace(seen, rank=i, gone_at=100.0 + need * 2) for i in (0, 1))
    done = settle(snap(total_steps=150, targets=(DOWN,), ranks=ranks), None)
    assert done.state is JobState.DONE and all(r.finished for r in done.ranks)
    failed = settle(snap(total_steps=150, targets=(DOWN,),
                         ranks=(ranks[0], replace(ranks[1], gone_at=100.0 + need / 2))), None)
    assert failed.state is JobState.FAILED
    assert [r.rank for r in failed.gone_ranks] == [1]


def test_restarting_until_every_rank_is_back():
    before = replace(snap(world_size=2, restarts=0), state=JobState.RUNNING)
    one_back = snap(world_size=2, restarts=1,
                    ranks=(RankRow(rank=0, step=0), RankRow(rank=1, step=5, down=True)))
    assert state(one_back, previous=before) is JobState.RESTARTING
    restarting = replace(one_back, state=JobState.RESTARTING)
    assert state(one_back, previous=restarting) is JobState.RESTARTING
    both = snap(world_size=2, restarts=1, ranks=(RankRow(rank=0, step=1), RankRow(rank=1, step=1)))
    assert state(both, previous=restarting) is JobState.RUNNING
    assert state(both, previous=replace(both, state=JobState.RUNNING)) is JobState.RUNNING


def test_kubernetes_conditions_say_done_failed_restarting():
    running = settle(snap(), None)
    failed = [{"type": "Created", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
              {"type": "Running", "status": "False", "lastTransitionTime": "2026-01-01T00:01:00Z"},
              {"type": "Failed", "status": "True", "reason": "PyTorchJobFailed",
               "message": "worker-1 exited with code 137", "lastTransitionTime":
               "2026-01-01T00:02:00Z"}]
    out = with_conditions(running, failed)
    assert out.state is JobState.FAILED
    assert out.reason == "PyTorchJobFailed: worker-1 exited with code 137"
    done = with_conditions(running, [{"type": "Complete", "status": "True"}])
    assert (done.state, done.reason) == (JobState.DONE, "")
    assert with_conditions(running, [{"type": "Restarting", "status": "True"}]).state is (
        JobState.RESTARTING)
    assert with_conditions(running, [{"type": "Running", "status": "True"}]) == running
    assert with_conditions(running, [{"type": "Failed", "status": "False"}, "junk"]) == running


def test_a_job_that_says_it_succeeded_finished_every_rank_that_went_away():
    gone = (RankRow(rank=0, step=3), RankRow(rank=1, step=3, down=True))
    out = with_conditions(settle(snap(total_steps=5, ranks=gone), None),
                          [{"type": "Succeeded", "status": "True"}])
    assert out.state is JobState.DONE and out.step == 5 and out.gone_ranks == ()
