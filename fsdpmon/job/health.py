"""Judging a job's health from its snapshot: alerts (stall, straggler, target down, memory
pressure, lost GPU, non-finite loss) and the one-word state the header and `--once` report.

Pure functions of the snapshot; the thresholds are the ones the alert rules use, from
fsdpmon.conventions (a straggler scores below STRAGGLER_SCORE_THRESHOLD; memory pressure is
MEMORY_PRESSURE_RATIO of the device).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fsdpmon.conventions import MEMORY_PRESSURE_RATIO, STRAGGLER_SCORE_THRESHOLD
from fsdpmon.job.snapshot import Alert, JobSnapshot, JobState, RankRow, Severity


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
    out += _never_seen(snap)
    gone = [r for r in snap.ranks if r.down]
    early = [r for r in gone if gone_early(r, snap.total_steps)]
    if early:
        steps = [r.step for r in early if r.step is not None]
        last = f" (last seen at step {min(steps)}" if steps else ""
        last += f"/{snap.total_steps})" if last and snap.total_steps else (")" if last else "")
        out.append(Alert("rank_down", Severity.CRITICAL,
                         f"rank {_fmt_ranks([r.rank for r in early])} gone before the last "
                         f"step{last}"))
    finished = [r.rank for r in gone if not gone_early(r, snap.total_steps)]
    if finished:
        out.append(Alert("rank_down", Severity.WARNING,
                         f"rank {_fmt_ranks(finished)} finished and gone"))
    flagged = [r for r in live if r.slowest and r.straggler_score is not None]
    if flagged:
        r = flagged[0]
        # The monitor's flag clears only when two disjoint medians agree, so the score of the
        # moment may sit just above the line while the flag still stands.
        side = "<" if r.straggler_score < STRAGGLER_SCORE_THRESHOLD else "≥"
        out.append(Alert("straggler", Severity.WARNING,
                         f"rank {r.rank} straggles: score {r.straggler_score:.2f} {side} "
                         f"{STRAGGLER_SCORE_THRESHOLD:g} (the others wait for it)"))
    out += _memory_alerts(snap)
    lost = [f"{g.node}/{g.gpu}" for g in snap.gpus if not g.up]
    if lost:
        out.append(Alert("gpu_down", Severity.CRITICAL, f"GPU lost: {', '.join(lost[:6])}"))
    bad = [r.rank for r in live if r.loss_nonfinite
           or (r.loss is not None and not math.isfinite(r.loss))]
    if bad:
        out.append(Alert("loss_nonfinite", Severity.CRITICAL,
                         f"loss is NaN or infinite on rank {_fmt_ranks(bad)}"))
    return out


def never_seen(snap: JobSnapshot) -> list[int]:
    """Ranks below the job's world size that no target serves (not even as gone): e.g. ranks
    whose endpoint another job took, or whose pod never came up."""
    return list(snap.unseen_ranks())


def _never_seen(snap: JobSnapshot) -> list[Alert]:
    absent = never_seen(snap)
    if not absent:
        return []
    seen = {r.rank for r in snap.ranks}
    reporting = sum(1 for r in seen if 0 <= r < (snap.world_size or 0))
    return [Alert("rank_missing", Severity.CRITICAL,
                  f"only {reporting} of {snap.world_size} ranks report; rank "
                  f"{_fmt_ranks(absent)} never seen")]


def _memory_alerts(snap: JobSnapshot) -> list[Alert]:
    tight = [f"{g.node}/{g.gpu}" for g in snap.gpus
             if (ratio := g.memory_ratio) is not None and ratio >= MEMORY_PRESSURE_RATIO]
    tight += [f"rank {r.rank}" for r in snap.ranks
              if r.peak_memory_bytes and r.memory_capacity_bytes
              and r.peak_memory_bytes / r.memory_capacity_bytes >= MEMORY_PRESSURE_RATIO]
    if not tight:
        return []
    return [Alert("memory_pressure", Severity.WARNING,
                  f"memory ≥{MEMORY_PRESSURE_RATIO:.0%} used: {', '.join(tight[:6])}")]


def gone_early(r: RankRow, total: int | None) -> bool:
    """A vanished rank that cannot have reached its last step before it was found gone: it was
    last seen at step s of ``total`` taking t per step, so finishing needed (total − s)·t more
    seconds than it had between being last seen and being found gone. Without a plan, or
    without the figures to tell, a vanished rank did not finish."""
    if not r.down:
        return False
    if not total or r.step is None:
        return True
    if r.step >= total:
        return False
    if r.step_time_s is None or r.seen_at is None or r.gone_at is None:
        return True
    return r.seen_at + (total - r.step) * r.step_time_s > r.gone_at


def _restarting(snap: JobSnapshot, previous: JobSnapshot | None) -> bool:
    """The elastic agent restarted the ranks (their restart count went up) and not all of
    them are back yet."""
    if previous is None:
        return False
    went_up = (snap.restarts or 0) > (previous.restarts or 0)
    if not (went_up or previous.state is JobState.RESTARTING):
        return False
    back = [r for r in snap.ranks if not r.down and r.step is not None]
    return len(back) < (snap.world_size or len(snap.ranks))


def job_state(snap: JobSnapshot, previous: JobSnapshot | None) -> JobState:
    """One word for the job, from the rows and alerts already built (see JobState)."""
    live = [r for r in snap.ranks if not r.down]
    total = snap.total_steps
    if _restarting(snap, previous):
        return JobState.RESTARTING
    if snap.ranks and not live:
        early = any(gone_early(r, total) for r in snap.ranks)
        return JobState.FAILED if early else JobState.DONE
    if total and live and all((r.step or 0) >= total for r in live) and not any(
            gone_early(r, total) for r in snap.ranks):
        return JobState.DONE
    if snap.targets and snap.targets_up == 0:
        return JobState.DOWN
    if snap.stalled_ranks:
        return JobState.STALLED
    if snap.alerts:
        return JobState.DEGRADED
    return JobState.RUNNING


def settle(snap: JobSnapshot, previous: JobSnapshot | None) -> JobSnapshot:
    """The snapshot with its state; a finished job's training endpoints going away is the
    expected end, not an alert."""
    ranks = tuple(replace(r, finished=True) if r.down and not gone_early(r, snap.total_steps)
                  else r for r in snap.ranks)
    snap = replace(snap, ranks=ranks)
    state = job_state(snap, previous)
    kept = snap.alerts
    if state is JobState.DONE:
        kept = tuple(a for a in kept if a.kind not in ("target_down", "rank_down"))
        if any(r.finished for r in ranks):  # they got to the end, not just to where last seen
            snap = replace(snap, step=snap.total_steps or snap.step)
    return replace(snap, state=state, alerts=kept)


# A Kubernetes job's own conditions (PyTorchJob: Created, Running, Restarting, Succeeded,
# Failed; TrainJob: Created, Suspended, Complete, Failed) → the state they say for sure.
CONDITION_STATES = {"Succeeded": JobState.DONE, "Complete": JobState.DONE,
                    "Failed": JobState.FAILED, "Restarting": JobState.RESTARTING}


def current_condition(conditions: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The latest condition that holds (status "True"), as `kubectl describe` lists them."""
    held = [c for c in conditions if isinstance(c, dict) and str(c.get("status")) == "True"]
    held.sort(key=lambda c: str(c.get("lastTransitionTime") or ""))
    return held[-1] if held else None


def with_conditions(snap: JobSnapshot, conditions: Sequence[dict[str, Any]]) -> JobSnapshot:
    """The job's own status decides DONE, FAILED and RESTARTING; the failed condition's
    reason (and message) goes to the header."""
    cond = current_condition(conditions)
    state = CONDITION_STATES.get(str(cond.get("type"))) if cond else None
    if cond is None or state is None:
        return snap
    reason = ""
    if state is not JobState.DONE:
        reason = ": ".join(str(x) for x in (cond.get("reason"), cond.get("message")) if x)
    if state is JobState.DONE:  # it says it finished: so did every rank that went away
        ranks = tuple(replace(r, finished=True) if r.down else r for r in snap.ranks)
        snap = replace(snap, ranks=ranks, step=snap.total_steps or snap.step, alerts=tuple(
            a for a in snap.alerts if a.kind not in ("target_down", "rank_down")))
    return replace(snap, state=state, reason=reason[:200])
