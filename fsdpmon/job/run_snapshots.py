"""A run's JSONL as the judge's evidence: at each log step, the snapshot of the figures every
rank recorded then, which are the figures its endpoint served (the monitor writes one record
and publishes the same values), so that the replayed judge (fsdpmon.diagnose.replay) decides
from the files what it decided live (`fsdpmon incidents`, goodput's straggler time). The
files have no GPU, node or target series.
"""

from __future__ import annotations

from typing import Any

from fsdpmon.job.runlog import Incarnation, RunLog, number
from fsdpmon.job.snapshot import JobSnapshot, RankRow


def _row(rank: int, rec: dict[str, Any], place: dict[str, str]) -> RankRow:
    straggling = rec.get("straggling")
    return RankRow(
        rank=rank, pod=place.get("pod", ""), node=place.get("node", ""),
        step=int(rec["step"]), loss=number(rec.get("loss")),
        grad_norm=number(rec.get("grad_norm")), loss_nonfinite=rec.get("loss_nonfinite") is True,
        step_time_s=number(rec.get("step_time_s")),
        data_wait_ratio=number(rec.get("data_wait_ratio")), busy_s=number(rec.get("busy_s")),
        collective_wait_ratio=number(rec.get("collective_wait_ratio")),
        straggler_score=number(rec.get("straggler_score")),
        straggling=straggling if isinstance(straggling, bool) else None,
        waited_for_score=number(rec.get("waited_for_score")),
        # the endpoint serves the median over the recent steps, recorded as the span's ratio
        descheduled_ratio=number(rec.get("descheduled_span_ratio")),
        cpu_throttled_ratio=number(rec.get("cpu_throttled_ratio")),
        seen_at=number(rec.get("time")))


def step_snapshots(run: RunLog, inc: Incarnation) -> list[JobSnapshot]:
    """One snapshot per log step of ``inc`` (at the latest of its ranks' record times), the
    ranks that recorded that step in it, oldest first."""
    by_step: dict[int, list[tuple[float, RankRow]]] = {}
    for rank, records in inc.steps.items():
        for rec in records:
            if number(rec.get("step")) is not None and number(rec.get("time")) is not None:
                row = _row(rank, rec, run.ranks.get(rank, {}))
                by_step.setdefault(int(rec["step"]), []).append((rec["time"], row))
    out = []
    for step, seen in sorted(by_step.items()):
        rows = tuple(sorted((r for _, r in seen), key=lambda r: r.rank))
        # the job's loss as the endpoint's aggregate has it: the mean over the ranks
        losses = [r.loss for r in rows if r.loss is not None]
        out.append(JobSnapshot(time=max(t for t, _ in seen), source="files", job_name=run.job,
                               step=step, world_size=run.world_size, ranks=rows,
                               loss=sum(losses) / len(losses) if losses else None))
    # a step recorded later than the next (clocks apart) must not go back in time
    return sorted(out, key=lambda s: (s.time, s.step or 0))

