"""Judging a job's health from its snapshot: alerts (stall, straggler, target down, memory
pressure, lost GPU, non-finite loss) and the one-word state the header and `--once` report.

Pure functions of the snapshot; the thresholds are the ones the alert rules use in spirit
(a straggler is 20% slower than the median; memory pressure is 95% of the device).
"""

from __future__ import annotations

from collections.abc import Sequence

from fsdpmon.conventions import MEMORY_PRESSURE_RATIO
from fsdpmon.top.snapshot import Alert, JobSnapshot, JobState, Severity

STRAGGLER_RATIO = 1.2  # slowest rank's step time over the median that makes it a straggler


def _fmt_ranks(ranks: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" (+{len(ranks) - limit} more)" if len(ranks) > limit else "")


def alerts(snap: JobSnapshot) -> list[Alert]:
    """What is wrong with the job right now, most urgent first."""
    out: list[Alert] = []
    live = [r for r in snap.ranks if not r.down]
    stalled = [r.rank for r in live if r.stalled]
    if stalled:
        out.append(Alert("stall", Severity.CRITICAL,
                            f"rank {_fmt_ranks(stalled)} stalled: no step within the threshold"))
    down = [t for t in snap.targets if not t.up]
    if down:
        names = ", ".join(t.pod or t.url for t in down[:4]) + (" ..." if len(down) > 4 else "")
        out.append(Alert("target_down", Severity.CRITICAL,
                            f"{len(down)} of {len(snap.targets)} targets down: {names}"))
    gone = [r.rank for r in snap.ranks if r.down]
    if gone:
        out.append(Alert("rank_down", Severity.CRITICAL,
                            f"rank {_fmt_ranks(gone)} not reporting"))
    median, worst = snap.step_time_median_s, snap.step_time_max_s
    if (snap.slowest_rank is not None and median and worst
            and worst > STRAGGLER_RATIO * median):
        out.append(Alert("straggler", Severity.WARNING,
                            f"rank {snap.slowest_rank} straggles: step {worst:.3g}s vs median "
                            f"{median:.3g}s"))
    out += _memory_alerts(snap)
    lost = [f"{g.node}/{g.gpu}" for g in snap.gpus if not g.up]
    if lost:
        out.append(Alert("gpu_down", Severity.CRITICAL, f"GPU lost: {', '.join(lost[:6])}"))
    if any(r.loss is not None and r.loss != r.loss for r in live):
        out.append(Alert("loss_nonfinite", Severity.CRITICAL, "loss is NaN or infinite"))
    return out


def _memory_alerts(snap: JobSnapshot) -> list[Alert]:
    tight = [f"{g.node}/{g.gpu}" for g in snap.gpus
             if g.memory_ratio is not None and g.memory_ratio >= MEMORY_PRESSURE_RATIO]
    tight += [f"rank {r.rank}" for r in snap.ranks
              if r.peak_memory_bytes and r.memory_capacity_bytes
              and r.peak_memory_bytes / r.memory_capacity_bytes >= MEMORY_PRESSURE_RATIO]
    if not tight:
        return []
    return [Alert("memory_pressure", Severity.WARNING,
                  f"memory ≥{MEMORY_PRESSURE_RATIO:.0%} used: {', '.join(tight[:6])}")]


def job_state(snap: JobSnapshot, previous: JobSnapshot | None) -> JobState:
    """RUNNING, DEGRADED, STALLED, DONE or DOWN, from the rows and alerts already built."""
    live = [r for r in snap.ranks if not r.down]
    if snap.total_steps and live and all((r.step or 0) >= snap.total_steps for r in live):
        return JobState.DONE
    if snap.targets and snap.targets_up == 0:
        return JobState.DONE if previous and previous.state is JobState.DONE else JobState.DOWN
    if snap.stalled_ranks:
        return JobState.STALLED
    if snap.alerts:
        return JobState.DEGRADED
    return JobState.RUNNING
