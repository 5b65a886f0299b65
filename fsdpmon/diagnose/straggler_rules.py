"""The straggler rules of the diagnosis: the rank the others wait for, and why it is slow (its
own compute, its data, its node's CPUs, or its GPU's clocks).

``straggler_cause`` reads only a rank's own figures against its peers' (the monitor's medians
over its log window), so the glance at one refresh names a flagged straggler's cause the same
way the engine does over the evidence window.
"""

from __future__ import annotations

from fsdpmon.conventions import STRAGGLER_CAUSE_SHARE, Severity
from fsdpmon.diagnose.findings import Finding, median, where
from fsdpmon.diagnose.observe import Observations, Places
from fsdpmon.job.snapshot import RankRow

WHY = {"straggler_compute": "its own compute is slow", "straggler_data": "it waits for data",
       "host_cpu_contention": "its node's CPUs are saturated"}


def straggler_cause(row: RankRow, live: list[RankRow]) -> tuple[str, str]:
    """compute or data, and the figures that say so, against the other ranks' median as its
    score is: data when at least STRAGGLER_CAUSE_SHARE of its extra busy time is extra data
    wait. (Never checkpointing: saves run between steps, outside the busy time; see the
    engine's checkpoint rule.)"""
    others = [r for r in live if r.rank != row.rank]
    busy = median([r.busy_s for r in others if r.busy_s is not None])
    if row.busy_s is None:  # a score served without its busy time: nothing to split
        return "straggler_compute", f"busy time not served; the others' median {busy:.3f} s"
    excess = row.busy_s - busy
    extra_data = _data_s(row) - median([_data_s(r) for r in others])
    if excess > 0 and extra_data >= STRAGGLER_CAUSE_SHARE * excess:
        return "straggler_data", (f"data wait {_data_s(row):.3f} s vs the others' median "
                                  f"{_data_s(row) - extra_data:.3f} s: {extra_data:.3f} s of "
                                  f"its {excess:.3f} s extra busy time")
    return "straggler_compute", f"busy {row.busy_s:.3f} s vs the others' median {busy:.3f} s"


def _data_s(row: RankRow) -> float:
    return (row.data_wait_ratio or 0.0) * (row.step_time_s or 0.0)


def _contended(row: RankRow, live: list[RankRow], obs: Observations) -> bool:
    """The straggler's node is CPU-saturated and some rank it is slower than runs on a node
    that is not: contention on a node that all its peers share slows them all alike, so it
    cannot be why this one rank is slower (a one-node job on a busy host)."""
    peers = [r for r in live if r.rank not in obs.stragglers]
    return row.node in obs.busy_nodes and any(r.node not in obs.busy_nodes for r in peers)


def stragglers(obs: Observations, places: Places) -> list[Finding]:
    """A straggler whose GPU was throttled (or power-capped) the whole window is the GPU's
    fault; else its own compute, its data, or its node's saturated CPUs."""
    live = [r for r in obs.now.ranks if not r.down]
    out = []
    for rank in sorted(obs.stragglers):
        row = places.ranks[rank]
        gpu = places.gpu_of(rank)
        score = f"straggler score {row.straggler_score:.2f} for {obs.seconds:.0f}s"
        if gpu is not None and (gpu in obs.throttled or gpu in obs.power_capped):
            reasons = obs.throttled.pop(gpu, []) or ["sw_power_cap"]
            out.append(Finding(
                "gpu_throttled", Severity.WARNING,
                f"GPU {gpu[1]} on {gpu[0]} throttled ({', '.join(reasons)}) slows rank {rank}",
                evidence=(f"clock events active for {obs.seconds:.0f}s: {', '.join(reasons)}",
                          f"rank {rank} {score}"), **where(places, rank, gpu)))
            continue
        cause, detail = straggler_cause(row, live)
        if cause == "straggler_compute" and _contended(row, live, obs):
            cause, detail = "host_cpu_contention", f"node {row.node} CPUs saturated; {detail}"
        out.append(Finding(cause, Severity.WARNING, f"rank {rank} straggles: {WHY[cause]}",
                           evidence=(score, detail), **where(places, rank)))
    return out
