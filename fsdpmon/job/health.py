"""The one-word state of a job (see JobState) from the facts its snapshot states: what the
header's title and `--once`'s exit status report along with the diagnosis' findings.

Pure functions of the snapshots. The state judges nothing: which rank is to blame, and why, is
the diagnosis' word (fsdpmon.diagnose); here a job is DEGRADED when any fact short of a stall
holds (a target down, a rank gone or never seen, a GPU down, a straggler flagged, memory at the
pressure line, a non-finite loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fsdpmon.job.snapshot import JobSnapshot, JobState, RankRow


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


def troubled(snap: JobSnapshot) -> bool:
    """Something short of a stall is wrong with a job that still trains."""
    return bool(snap.down_targets or snap.gone_ranks or snap.unseen_ranks(1) or snap.lost_gpus
                or snap.flagged_straggler or snap.tight_ranks or snap.tight_gpus
                or snap.nonfinite_ranks)


def job_state(snap: JobSnapshot, previous: JobSnapshot | None) -> JobState:
    """One word for the job, from the rows already built (see JobState)."""
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
    if troubled(snap):
        return JobState.DEGRADED
    return JobState.RUNNING


def settle(snap: JobSnapshot, previous: JobSnapshot | None) -> JobSnapshot:
    """The snapshot with its state; ranks that went away after their last step are marked
    ``finished`` (a finished job's training endpoints going away is the expected end)."""
    ranks = tuple(replace(r, finished=True) if r.down and not gone_early(r, snap.total_steps)
                  else r for r in snap.ranks)
    snap = replace(snap, ranks=ranks)
    state = job_state(snap, previous)
    if state is JobState.DONE and any(r.finished for r in ranks):
        snap = replace(snap, step=snap.total_steps or snap.step)  # the end, not where last seen
    return replace(snap, state=state)


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
        snap = replace(snap, ranks=ranks, step=snap.total_steps or snap.step)
    return replace(snap, state=state, reason=reason[:200])
