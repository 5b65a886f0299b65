"""The host CPU rule of the diagnosis: a rank the others wait for because it waits for a CPU.

A straggler is the rank the others wait for, whatever slows it. Its busy time (its own work)
names a compute or data straggler; a rank starved of CPU is waited for but not busy: its time
goes to the run queue (other processes on its cores) or to its cgroup's CFS throttling (its
pod's CPU limit). The monitor serves both halves per rank: the waited-for score (time not
waiting for peers, run-queue delay included) and the share of the step spent waiting for a CPU;
the cgroup's throttled share tells a CPU limit from a noisy neighbour.
"""

from __future__ import annotations

import statistics

from fsdpmon.conventions import CPU_THROTTLED_RATIO, STRAGGLER_SCORE_THRESHOLD, Severity
from fsdpmon.diagnose.findings import Finding, where
from fsdpmon.diagnose.observe import Observations, Places
from fsdpmon.job.snapshot import RankRow


def _others_median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def starved(obs: Observations, places: Places) -> list[Finding]:
    live = [r for r in obs.now.ranks if not r.down]
    out = []
    for rank in sorted(obs.starved):
        row = places.ranks[rank]
        others = [r for r in live if r.rank != rank]
        evidence = [_waited(row, obs.seconds), _descheduled(row, others)]
        if rank in obs.cpu_throttled:
            cause = "cpu_throttled"
            summary = f"rank {rank} is held back by its CPU limit: the others wait for it"
            evidence.append(f"its cgroup (the pod's CPU limit) was throttled in "
                            f"{obs.cpu_throttled[rank]:.0%} of its CFS periods "
                            f"(≥ {CPU_THROTTLED_RATIO:.0%} over the window)")
        else:
            cause = "host_cpu_contention"
            summary = f"rank {rank} straggles: starved of CPU by other work on its node"
            evidence.append(_neighbours(row, obs))
        out.append(Finding(cause, Severity.WARNING, summary, evidence=tuple(evidence),
                           **where(places, rank)))
    return out


def _waited(row: RankRow, seconds: float) -> str:
    return (f"the others wait for it: waited-for score {row.waited_for_score or 0:.2f} "
            f"(< {STRAGGLER_SCORE_THRESHOLD:g}) for {seconds:.0f}s, but straggler score "
            f"{_score(row.straggler_score)}: its own work is no slower than theirs")


def _score(score: float | None) -> str:
    return "unknown" if score is None else f"{score:.2f}"


def _descheduled(row: RankRow, others: list[RankRow]) -> str:
    median = _others_median([r.descheduled_ratio for r in others])
    theirs = "unknown" if median is None else f"{median:.0%}"
    return (f"waits for a CPU {row.descheduled_ratio or 0:.0%} of its step vs the others' "
            f"median {theirs}")


def _neighbours(row: RankRow, obs: Observations) -> str:
    node = next((n for n in obs.now.nodes if n.node == row.node), None)
    busy = node.cpu_utilization_ratio if node is not None else None
    limit = ("its cgroup is not throttled" if row.cpu_throttled_ratio is not None
             else "no cgroup CPU limit read")
    where_ = f"node {row.node}" if row.node else "its node"
    cpus = f"; {where_} CPUs {busy:.0%} busy" if busy is not None else ""
    return f"other processes share its CPUs ({limit}){cpus}"
