"""The rank the others wait for, and why: its own work (compute, data) or waiting for a CPU
(other work on its cores, or its pod's CPU limit). Snapshots built as the sources build them
(top_snapshots), judged by the pure engine; every boundary pinned on both sides."""

from __future__ import annotations

import dataclasses

import pytest
from top_snapshots import diagnosis_history

from fsdpmon.conventions import (
    CPU_THROTTLED_RATIO,
    DIAGNOSIS_EVIDENCE_SECONDS,
    STRAGGLER_SCORE_THRESHOLD,
)
from fsdpmon.diagnose import Finding, diagnose

N = int(DIAGNOSIS_EVIDENCE_SECONDS // 2) + 2
WAITED = STRAGGLER_SCORE_THRESHOLD * 0.7  # the others wait for this rank


def judged(r2: dict, **others: dict) -> list[Finding]:
    """Rank 2 as given (others' descheduled 5%, straggler score 1.0 by default)."""
    return diagnose(diagnosis_history(lambda i: {"specs": {"r2": r2, **others}}, N))


def only(findings: list[Finding], cause: str) -> Finding:
    assert [f.cause for f in findings] == [cause], findings
    return findings[0]


STARVED = {"waited_for_score": WAITED, "descheduled_ratio": 0.41}


def test_a_rank_waited_for_that_waits_for_a_cpu_is_host_cpu_contention():
    f = only(judged(STARVED), "host_cpu_contention")
    assert (f.rank, f.pod, f.node, f.severity) == (2, "llama-worker-1", "node-1", "warning")
    assert any("waits for a CPU 41% of its step vs the others' median 5%" in e
               for e in f.evidence), f.evidence
    assert any(f"waited-for score {WAITED:.2f}" in e and "straggler score 1.00" in e
               for e in f.evidence), f.evidence


def test_its_cgroup_throttled_makes_it_cpu_throttled():
    f = only(judged({**STARVED, "cpu_throttled_ratio": 0.9}), "cpu_throttled")
    assert (f.rank, f.node) == (2, "node-1")
    assert any("throttled in 90% of its CFS periods" in e for e in f.evidence), f.evidence
    assert "llama-worker-1" in f.next_step


@pytest.mark.parametrize("share, cause", [(CPU_THROTTLED_RATIO, "cpu_throttled"),
                                          (CPU_THROTTLED_RATIO - 0.01, "host_cpu_contention")])
def test_the_throttled_share_boundary(share, cause):
    only(judged({**STARVED, "cpu_throttled_ratio": share}), cause)


def test_a_score_at_the_line_is_not_waited_for():
    assert judged({**STARVED, "waited_for_score": STRAGGLER_SCORE_THRESHOLD}) == []
    only(judged({**STARVED, "waited_for_score": STRAGGLER_SCORE_THRESHOLD - 0.01}),
         "host_cpu_contention")


def test_waiting_for_a_cpu_no_more_than_the_others_is_not_starvation():
    """Waited for, but its CPU wait is the others' median: not the CPU (a straggler the busy
    score missed, or noise); nothing is named on this evidence."""
    assert judged({**STARVED, "descheduled_ratio": 0.05}) == []
    only(judged({**STARVED, "descheduled_ratio": 0.06}), "host_cpu_contention")


def test_a_busy_rank_is_a_compute_straggler_not_starved():
    f = only(judged({**STARVED, "straggler_score": STRAGGLER_SCORE_THRESHOLD * 0.8,
                     "busy_s": 0.7}), "straggler_compute")
    assert f.rank == 2


def test_starvation_must_hold_over_the_window():
    snaps = diagnosis_history(lambda i: {"specs": {"r2": STARVED if i != N // 2 else {}}}, N)
    assert diagnose(snaps) == []


def test_every_rank_equally_starved_names_none():
    """A host every rank shares, all waiting for CPUs alike: nobody is waited for."""
    assert judged({"descheduled_ratio": 0.4},
                  **{f"r{r}": {"descheduled_ratio": 0.4} for r in (0, 1, 3)}) == []


def test_straggler_evidence_compares_with_the_other_ranks_median():
    """The score is the OTHER ranks' median busy time over the rank's own; the evidence shows
    that comparison (with every rank's median, the straggler's own time would pull it up)."""
    specs = {"r0": {"busy_s": 0.026}, "r1": {"busy_s": 0.026}, "r3": {"busy_s": 0.027},
             "r2": {"busy_s": 0.086, "straggler_score": 0.026 / 0.086}}
    f = only(diagnose(diagnosis_history(lambda i: {"specs": specs}, N)), "straggler_compute")
    assert "busy 0.086 s vs the others' median 0.026 s" in f.evidence, f.evidence


def test_data_straggler_evidence_compares_with_the_others():
    specs = {"r1": {"straggler_score": 0.5, "busy_s": 0.75, "data_wait_ratio": 0.6}}
    f = only(diagnose(diagnosis_history(lambda i: {"specs": specs}, N)), "straggler_data")
    assert any("vs the others' median" in e and "extra busy time" in e for e in f.evidence), (
        f.evidence)


def test_the_throttled_share_shown_is_the_one_judged_over_the_window():
    """The verdict takes the median share over the window; the evidence shows that median,
    not the newest sample (which may be missing or a lull)."""
    for last in (0.3, None):
        snaps = diagnosis_history(lambda i, last=last: {"specs": {"r2": {
            **STARVED, "cpu_throttled_ratio": last if i == N - 1 else 0.9}}}, N)
        f = only(diagnose(snaps), "cpu_throttled")
        assert any("throttled in 90% of its CFS periods" in e for e in f.evidence), (
            last, f.evidence)


def test_a_waited_for_score_of_zero_is_shown_as_zero():
    f = only(judged({**STARVED, "waited_for_score": 0.0}), "host_cpu_contention")
    assert any("waited-for score 0.00 " in e for e in f.evidence), f.evidence


def neighbours(r2: dict, node_busy: dict[str, float | None]) -> str:
    """The contention finding's last evidence line, rank 2 on node-1, with the nodes' CPU
    busy shares as given."""
    snaps = [dataclasses.replace(s, nodes=tuple(
        dataclasses.replace(n, cpu_utilization_ratio=node_busy[n.node]) for n in s.nodes))
        for s in diagnosis_history(lambda i: {"specs": {"r2": r2}}, N)]
    f = only(diagnose(snaps), "host_cpu_contention")
    assert f.node == "node-1", f
    return f.evidence[-1]


@pytest.mark.parametrize("r2, busy, said", [
    ({}, {"node-0": 0.35, "node-1": 0.62},
     "other processes share its CPUs (its cgroup is not throttled); node node-1 CPUs 62% busy"),
    ({"cpu_throttled_ratio": None}, {"node-0": 0.35, "node-1": 0.62},
     "other processes share its CPUs (no cgroup CPU limit read); node node-1 CPUs 62% busy"),
    ({}, {"node-0": 0.35, "node-1": None},
     "other processes share its CPUs (its cgroup is not throttled)"),
])
def test_contention_evidence_names_its_own_node_and_whether_a_limit_was_read(r2, busy, said):
    got = neighbours({**STARVED, **r2}, busy)
    assert got == said, f"{got!r} != {said!r}"
