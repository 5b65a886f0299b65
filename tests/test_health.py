"""Alerts and the job state from a snapshot: precedence and thresholds."""

from __future__ import annotations

from dataclasses import replace

from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD
from fsdpmon.job.health import (
    MEMORY_PRESSURE_RATIO,
    alerts,
    gone_early,
    job_state,
    settle,
    with_conditions,
)
from fsdpmon.job.snapshot import GpuRow, JobSnapshot, JobState, RankRow, TargetStatus

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
    finished = tuple(RankRow(rank=i, step=5, down=True) for i in (0, 1))
    assert state(snap(total_steps=5, targets=(DOWN,), ranks=finished)) is JobState.DONE
    early = tuple(RankRow(rank=i, step=3, down=True) for i in (0, 1))
    assert state(snap(total_steps=5, targets=(DOWN,), ranks=early)) is JobState.FAILED
    assert state(snap(targets=(DOWN,), ranks=finished)) is JobState.FAILED  # no plan: not done


def test_straggler_alert_follows_the_flagged_score():
    rows = (RankRow(rank=0, step=5, straggler_score=1.2),
            RankRow(rank=1, step=5, straggler_score=0.6, slowest=True))
    assert [a.message for a in alerts(snap(ranks=rows)) if a.kind == "straggler"] == [
        f"rank 1 straggles: score 0.60 < {STRAGGLER_SCORE_THRESHOLD:g} (the others wait for it)"]
    unflagged = (rows[0], replace(rows[1], slowest=False))
    assert not [a for a in alerts(snap(ranks=unflagged)) if a.kind == "straggler"]

def test_memory_pressure_and_lost_gpu():
    full = GpuRow(node="n", gpu="0", memory_used_bytes=MEMORY_PRESSURE_RATIO * 80,
                  memory_total_bytes=80)
    lost = GpuRow(node="n", gpu="1", up=False)
    kinds = {a.kind for a in alerts(snap(gpus=(full, lost)))}
    assert kinds == {"memory_pressure", "gpu_down"}
    many = tuple(RankRow(rank=r, stalled=True) for r in range(12))
    stall = next(a for a in alerts(snap(ranks=many)) if a.kind == "stall")
    assert "rank 0, 1, 2, 3, 4, 5, 6, 7 (+4 more) stalled" in stall.message


def test_a_rank_that_went_away_finished_only_if_it_had_the_time_to():
    # last seen at step 140 of 150 taking 0.05 s a step: it needed 10 x 0.05 = 0.5 s more
    need = (150 - 140) * 0.05
    seen = RankRow(rank=0, step=140, step_time_s=0.05, seen_at=100.0, down=True)
    assert not gone_early(replace(seen, gone_at=100.0 + need * 1.01), 150)
    assert gone_early(replace(seen, gone_at=100.0 + need * 0.99), 150)
    assert not gone_early(replace(seen, step=150, gone_at=100.0), 150)  # seen at its last step
    assert gone_early(replace(seen, gone_at=1e9), None)  # no plan: nothing says it finished
    ranks = tuple(replace(seen, rank=i, gone_at=100.0 + need * 2) for i in (0, 1))
    done = snap(total_steps=150, targets=(DOWN,), ranks=ranks)
    assert state(done) is JobState.DONE
    failed = snap(total_steps=150, targets=(DOWN,),
                  ranks=(ranks[0], replace(ranks[1], gone_at=100.0 + need / 2)))
    assert state(failed) is JobState.FAILED
    assert "rank 1 gone before the last step (last seen at step 140/150)" in [
        a.message for a in alerts(failed)]


def test_restarting_until_every_rank_is_back():
    before = replace(snap(world_size=2, restarts=0), state=JobState.RUNNING)
    one_back = snap(world_size=2, restarts=1,
                    ranks=(RankRow(rank=0, step=0), RankRow(rank=1, step=5, down=True)))
    assert state(one_back, previous=before) is JobState.RESTARTING
    restarting = replace(one_back, state=JobState.RESTARTING)
    assert state(replace(one_back, alerts=()), previous=restarting) is JobState.RESTARTING
    both = snap(world_size=2, restarts=1, ranks=(RankRow(rank=0, step=1), RankRow(rank=1, step=1)))
    assert state(both, previous=restarting) is JobState.RUNNING
    assert state(both, previous=replace(both, state=JobState.RUNNING)) is JobState.RUNNING


def test_kubernetes_conditions_say_done_failed_restarting():
    running = settle(replace(snap(), alerts=()), None)
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


def test_fewer_ranks_than_the_world_size_is_flagged():
    one = (RankRow(rank=0, step=5),)  # rank 1 never reported (another job took its endpoint)
    found = alerts(snap(ranks=one, world_size=2))
    assert [(a.kind, a.message) for a in found] == [
        ("rank_missing", "only 1 of 2 ranks report; rank 1 never seen")], found
    assert state(snap(ranks=one, world_size=2)) is JobState.DEGRADED
    assert alerts(snap(world_size=2)) == []  # both report: nothing named
