"""The diagnosis engine on built snapshots: each cause named with its culprit, cascades folded
into one finding, no verdict from one sample, findings gone when the evidence goes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from top_snapshots import REFRESH_S, diagnosis_history

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS, STRAGGLER_SCORE_THRESHOLD
from fsdpmon.diagnose import CAUSES, Finding, RankStack, diagnose, merge, parse_stacks
from fsdpmon.diagnose.stacks import Frame
from fsdpmon.job.snapshot import JobSnapshot, TargetStatus

# Enough refreshes to span the evidence window, and one more.
N = int(DIAGNOSIS_EVIDENCE_SECONDS // REFRESH_S) + 2


def history(at: Callable[[int], dict], n: int = N) -> list[JobSnapshot]:
    return diagnosis_history(at, n)


def causes(findings: list[Finding]) -> list[str]:
    return [f.cause for f in findings]


def only(findings: list[Finding], cause: str) -> Finding:
    assert causes(findings) == [cause], f"expected just {cause}, got {findings}"
    return findings[0]


def test_healthy_job_has_no_findings():
    assert diagnose(history(lambda i: {})) == []


def test_cause_names_are_the_documented_ones():
    assert set(CAUSES) == {
        "hang", "rank_unresponsive", "rank_missing", "crash_loop", "straggler_compute",
        "straggler_data", "gpu_throttled", "gpu_xid", "gpu_lost", "gpu_ecc", "loss_nonfinite",
        "loss_spike", "memory_pressure", "checkpoint_slow", "host_cpu_contention",
        "cpu_throttled", "target_down"}


SLOW = STRAGGLER_SCORE_THRESHOLD * 0.8


def test_straggler_compute_names_rank_pod_node_gpu():
    f = only(diagnose(history(lambda i: {"specs": {"r2": {"straggler_score": SLOW,
                                                          "busy_s": 0.7}}})),
             "straggler_compute")
    assert (f.rank, f.pod, f.node, f.gpu, f.severity) == (2, "llama-worker-1", "node-1", "0",
                                                         "warning")
    assert f.to_dict()["next_step"] and "node-1" in f.next_step


def test_no_verdict_from_a_short_history():
    """Evidence shorter than the window is not a verdict, however strong."""
    short = history(lambda i: {"specs": {"r2": {"straggler_score": 0.1}}}, n=N - 2)
    assert short[-1].time - short[0].time < DIAGNOSIS_EVIDENCE_SECONDS
    assert diagnose(short) == []
    assert diagnose(short[-1:]) == []


def test_finding_clears_when_the_evidence_goes():
    snaps = history(lambda i: {"specs": {"r2": {"straggler_score": SLOW}}} if i < N - 1 else {})
    assert diagnose(snaps[:-1]) and diagnose(snaps) == []


def test_evidence_must_hold_in_every_sample():
    """One healthy sample inside the window breaks the verdict (no intermittent flapping)."""
    snaps = history(lambda i: {} if i == N // 2 else {"specs": {"r2": {"straggler_score": SLOW}}})
    assert diagnose(snaps) == []


def busy_cpus(snaps: list[JobSnapshot], nodes: set[str]) -> list[JobSnapshot]:
    return [dataclasses.replace(s, nodes=tuple(
        dataclasses.replace(n, cpu_utilization_ratio=0.99 if n.node in nodes else 0.35)
        for n in s.nodes)) for s in snaps]


def test_a_compute_straggler_on_a_saturated_node_is_host_cpu_contention():
    snaps = history(lambda i: {"specs": {"r2": {"straggler_score": SLOW, "busy_s": 0.7}}})
    assert {n.node for n in snaps[-1].nodes} == {"node-0", "node-1"}
    f = only(diagnose(busy_cpus(snaps, {"node-1"})), "host_cpu_contention")
    assert (f.rank, f.node) == (2, "node-1"), f


def test_a_busy_host_that_every_rank_shares_does_not_explain_one_straggler():
    """Every node saturated (a one-node job on a busy host): the CPUs slow every rank alike,
    so the one slow rank's own compute is named."""
    snaps = history(lambda i: {"specs": {"r2": {"straggler_score": SLOW, "busy_s": 0.7}}})
    f = only(diagnose(busy_cpus(snaps, {"node-0", "node-1"})), "straggler_compute")
    assert f.rank == 2, f


def test_straggler_data_when_its_extra_time_is_data_wait():
    f = only(diagnose(history(lambda i: {"specs": {"r1": {
        "straggler_score": SLOW, "busy_s": 0.75, "data_wait_ratio": 0.6}}})), "straggler_data")
    assert f.rank == 1


def saves(own: dict[int, float], wall: float = 4.2, share: float = 0.6) -> dict:
    """Every rank's last save: ``wall`` seconds, ``share`` of the time; own work as given
    (the others waited the rest of ``wall`` for the slowest)."""
    return {f"r{r}": {"checkpoint_seconds": wall, "checkpoint_own_seconds": own.get(r, 0.1),
                      "checkpoint_time_ratio": share} for r in range(4)}


def test_slow_checkpoint_names_the_rank_the_others_waited_for():
    f = only(diagnose(history(lambda i: {"specs": saves({3: 4.1})})), "checkpoint_slow")
    assert (f.rank, f.pod, f.node) == (3, "llama-worker-1", "node-1"), f
    assert "60%" in f.summary and any("waited for rank 3" in e for e in f.evidence), f


def test_slow_checkpoint_job_wide_names_no_rank():
    """Every rank's own save work alike (a slow filesystem for all): no rank to blame."""
    f = only(diagnose(history(lambda i: {"specs": saves({r: 4.0 for r in range(4)})})),
             "checkpoint_slow")
    assert f.rank is None, f


def test_a_cheap_save_is_not_slow_even_if_one_rank_waits_for_another():
    """Rank 0 commits the checkpoint (its own work is the longest), but saves take 5% of the
    time: below CHECKPOINT_SHARE_LIMIT, nothing."""
    assert diagnose(history(lambda i: {"specs": saves({0: 4.1}, share=0.05)})) == []


def test_throttled_gpu_explains_its_ranks_straggling():
    snaps = history(lambda i: {"specs": {"r3": {"straggler_score": SLOW}},
                               "gpu": {(1, 1): {"clock_events": ("hw_thermal_slowdown",)}}})
    f = only(diagnose(snaps), "gpu_throttled")
    assert (f.rank, f.node, f.gpu) == (3, "node-1", "1")
    assert any("straggler score" in e for e in f.evidence), f.evidence


def test_throttled_gpu_without_a_straggler_is_still_named():
    f = only(diagnose(history(lambda i: {"gpu": {(0, 1): {"clock_events": ("hw_slowdown",)}}})),
             "gpu_throttled")
    assert (f.rank, f.gpu) == (1, "1")


def test_power_cap_alone_is_normal():
    assert diagnose(history(lambda i: {"gpu": {(0, 1): {"clock_events": ("sw_power_cap",)}}})) == []


STALLED = {"stalled": True, "heartbeat_age_s": 40.0}


def _all_stalled(**extra: dict) -> dict:
    return {f"r{r}": {**STALLED, **extra.get(f"r{r}", {})} for r in range(4)}


def _stack(rank: int, seq: int, where: str) -> RankStack:
    return RankStack(rank=rank, step=812, stalled=True, op="all_gather_into_tensor", seq=seq,
                     frames=(Frame("train.py", 10, "main"), Frame(where, 123, "wait")))


def test_hang_names_the_odd_rank_and_folds_the_waiters():
    stacks = [_stack(r, 21937, "fsdp.py") for r in (0, 1, 3)] + [_stack(2, 21936, "data.py")]
    f = only(diagnose(history(lambda i: {"specs": _all_stalled()}), stacks), "hang")
    assert (f.rank, f.pod, f.severity) == (2, "llama-worker-1", "critical")
    assert [c.ranks for c in f.stacks] == [(2,), (0, 1, 3)]
    assert "rank 2 at data.py:123 wait" in f.evidence[1] and "#21936" in f.evidence[1]


def test_hang_without_stacks_names_the_rank_behind():
    specs = _all_stalled(r1={"step": 99})
    f = only(diagnose(history(lambda i: {"specs": specs})), "hang")
    assert f.rank == 1


def test_unresponsive_rank_explains_the_stall():
    specs = _all_stalled(r3={"unresponsive": True})
    f = only(diagnose(history(lambda i: {"specs": specs})), "rank_unresponsive")
    assert f.rank == 3 and any("3 other ranks" in e for e in f.evidence), f.evidence


def test_lost_gpu_explains_its_ranks_stall():
    f = only(diagnose(history(lambda i: {"specs": _all_stalled(),
                                         "gpu": {(0, 1): {"up": False}}})), "gpu_lost")
    assert (f.rank, f.node, f.gpu) == (1, "node-0", "1")


def test_xid_rise_is_named_once_it_happens():
    def at(i: int) -> dict:
        return {"gpu": {(1, 0): {"xids": ((79, 1),) if i >= 2 else ()}}}
    f = only(diagnose(history(at)), "gpu_xid")
    assert (f.rank, f.node, f.gpu, f.severity) == (2, "node-1", "0", "critical")


def test_xid_seen_before_the_history_is_not_news():
    assert diagnose(history(lambda i: {"gpu": {(1, 0): {"xids": ((13, 4),)}}})) == []


def test_uncorrected_ecc_rise():
    f = only(diagnose(history(lambda i: {"gpu": {(0, 0): {"ecc_uncorrected": i // 3}}})),
             "gpu_ecc")
    assert (f.rank, f.gpu) == (0, "0")


def test_missing_pod_names_the_first_ranks_to_go():
    snaps = history(lambda i: {"down": (1,) if i >= 1 else ()})
    found = diagnose(snaps)
    f = only(found, "rank_missing")  # the node's exporter going too is evidence, not a finding
    assert (f.rank, f.pod) == (2, "llama-worker-1")
    assert any("other targets do not answer" in e for e in f.evidence), f.evidence


def test_exporter_down_alone_is_a_target_down():
    snaps = history(lambda i: {})
    bad = [dataclasses.replace(s, targets=(*s.targets, TargetStatus(
        "http://10.0.9.9:9521/metrics", "unknown", up=False, error="refused",
        pod="fsdpmon-exporter-9", node="node-9"))) for s in snaps]
    f = only(diagnose(bad), "target_down")
    assert (f.pod, f.node) == ("fsdpmon-exporter-9", "node-9")


def test_nonfinite_loss_on_one_rank():
    f = only(diagnose(history(lambda i: {"specs": {"r1": {"loss_nonfinite": True}}})),
             "loss_nonfinite")
    assert f.rank == 1


def test_memory_pressure():
    f = only(diagnose(history(lambda i: {"specs": {"r0": {"peak_memory_bytes": 79e9}}})),
             "memory_pressure")
    assert f.rank == 0


def test_critical_findings_come_first():
    snaps = history(lambda i: {"specs": {"r1": {"loss_nonfinite": True},
                                         "r2": {"straggler_score": SLOW}}})
    assert causes(diagnose(snaps)) == ["loss_nonfinite", "straggler_compute"]


@pytest.mark.parametrize("doc", [None, [], {"ranks": "x"}, {"ranks": [1, {"rank": "a"}]},
                                 {"ranks": [{"rank": 1, "frames": "x", "last_collective": 3}]}])
def test_stack_documents_are_read_without_trust(doc):
    for s in parse_stacks(doc):
        assert s.rank == 1 and s.frames == () and s.seq is None


def test_merge_thousands_of_ranks_into_few_classes():
    stacks = [_stack(r, 21937, "fsdp.py") for r in range(2048) if r != 17]
    stacks.append(_stack(17, 21936, "data.py"))
    classes = merge(stacks)
    assert [len(c.ranks) for c in classes] == [1, 2047]
    assert classes[0].ranks == (17,)
    assert classes[1].describe().startswith("2047 ranks at fsdp.py:123 wait (step 812, last "
                                            "collective #21937 all_gather_into_tensor)")


def test_a_rank_that_never_reported_is_missing():
    """Fewer ranks than the world size (another job took a pod's endpoint): named, not silent."""
    snaps = history(lambda i: {})
    world = snaps[-1].world_size or len(snaps[-1].ranks)
    gone = max(r.rank for r in snaps[-1].ranks)
    short = [dataclasses.replace(s, world_size=world,
                                 ranks=tuple(r for r in s.ranks if r.rank != gone))
             for s in snaps]
    f = only(diagnose(short), "rank_missing")
    assert f.rank == gone, f


def test_slow_checkpoints_need_the_whole_window():
    heavy = saves({1: 4.1})
    assert only(diagnose(history(lambda i: {"specs": heavy})), "checkpoint_slow").rank == 1
    once = history(lambda i: {"specs": heavy} if i == N - 1 else {})
    assert diagnose(once) == []
