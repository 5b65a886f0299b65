"""The diagnosis engine on built snapshots: each cause named with its culprit, cascades folded
into one finding, no verdict from one sample, findings gone when the evidence goes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
from top_snapshots import REFRESH_S, diagnosis_history

from fsdpmon.conventions import (
    DIAGNOSIS_EVIDENCE_SECONDS,
    STRAGGLER_SCORE_THRESHOLD,
)
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
        "hang", "collective_desync", "rank_unresponsive", "rank_missing", "crash_loop",
        "straggler_compute",
        "straggler_data", "gpu_throttled", "gpu_xid", "gpu_lost", "gpu_ecc", "loss_nonfinite",
        "loss_spike", "memory_pressure", "checkpoint_slow", "host_cpu_contention",
        "cpu_throttled", "training_unstable", "target_down"}


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
    assert f.summary == "GPU 1 on node-0 throttled (hw_slowdown)", f.summary
    assert f.evidence == ("clock events active for 10s: hw_slowdown",  # the healthy score: 1.0
                          "rank 1 straggler score 1.00 (not below the threshold yet)"), f.evidence


def test_a_throttled_gpu_of_a_rank_without_a_score_says_just_that():
    snaps = history(lambda i: {"gpu": {(0, 1): {"clock_events": ("hw_slowdown",)}}})
    unscored = [dataclasses.replace(s, ranks=tuple(
        dataclasses.replace(r, straggler_score=None) for r in s.ranks)) for s in snaps]
    f = only(diagnose(unscored), "gpu_throttled")
    assert f.evidence == ("clock events active for 10s: hw_slowdown",), f.evidence


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
    assert f.summary == "GPU 1 on node-0 lost (rank 1)", f.summary


def test_a_lost_gpu_carries_its_own_xids_and_no_other_gpus():
    """The XID 79 that came with the loss is its evidence (no finding of its own); another
    GPU's XID stays a finding of that GPU."""
    def at(i: int) -> dict:
        rose = i >= 2
        return {"specs": _all_stalled(),
                "gpu": {(0, 1): {"up": False, "xids": ((79, 1),) if rose else ()},
                        (1, 1): {"xids": ((13, 1),) if rose else ()}}}
    found = diagnose(history(at))
    assert causes(found) == ["gpu_lost", "gpu_xid"], found
    lost, xid = found
    assert lost.evidence[:2] == ("GPU 1 on node-0 not answering NVML for 10s",
                                 "XID 79 (0 → 1)"), lost.evidence
    assert not any("XID 13" in e for e in lost.evidence), lost.evidence
    assert (xid.node, xid.gpu, xid.summary) == ("node-1", "1", "GPU 1 on node-1 raised XID 13")


def test_a_lost_gpu_that_serves_no_rank_names_none():
    from fsdpmon.job.snapshot import GpuRow

    spare = GpuRow(node="node-0", gpu="7", up=False)
    snaps = [dataclasses.replace(s, gpus=(*s.gpus, spare)) for s in history(lambda i: {})]
    f = only(diagnose(snaps), "gpu_lost")
    assert (f.rank, f.summary) == (None, "GPU 7 on node-0 lost"), f


def test_xid_rise_is_named_once_it_happens():
    def at(i: int) -> dict:
        return {"gpu": {(1, 0): {"xids": ((79, 1),) if i >= 2 else ()}}}
    f = only(diagnose(history(at)), "gpu_xid")
    assert (f.rank, f.node, f.gpu, f.severity) == (2, "node-1", "0", "critical")


@pytest.mark.parametrize("code, severity", [(13, "warning"), (79, "critical")])
def test_an_xid_is_critical_only_when_it_means_draining_the_node(code, severity):
    """XID 79 (fallen off the bus) needs the node drained; XID 13 (a graphics engine exception,
    most often the application's own fault) is worth a look, not a page (DESIGN.md's list)."""
    def at(i: int) -> dict:
        return {"gpu": {(1, 0): {"xids": ((code, 1),) if i >= 2 else ()}}}
    f = only(diagnose(history(at)), "gpu_xid")
    assert (f.rank, f.node, f.gpu, f.severity) == (2, "node-1", "0", severity), f
    assert f.summary == f"GPU 0 on node-1 raised XID {code}", f.summary
    assert f.evidence == (f"XID {code}: 0 → 1", "it serves rank 2"), f.evidence


def test_xid_seen_before_the_history_is_not_news():
    assert diagnose(history(lambda i: {"gpu": {(1, 0): {"xids": ((13, 4),)}}})) == []


def test_uncorrected_ecc_rise():
    f = only(diagnose(history(lambda i: {"gpu": {(0, 1): {"ecc_uncorrected": 1 + i // 3}}})),
             "gpu_ecc")
    assert (f.rank, f.gpu) == (1, "1")
    assert f.summary == "GPU 1 on node-0: uncorrected ECC errors (+2)", f.summary
    assert f.evidence == ("uncorrected ECC errors 1 → 3",), f.evidence


def test_uncorrected_ecc_explains_its_ranks_straggling():
    f = only(diagnose(history(lambda i: {"specs": {"r1": {"straggler_score": SLOW}},
                                         "gpu": {(0, 1): {"ecc_uncorrected": i // 3}}})),
             "gpu_ecc")
    assert f.rank == 1, f


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
    assert (f.summary, f.evidence) == ("target fsdpmon-exporter-9 down", (
        "http://10.0.9.9:9521/metrics (unknown) not answering for 10s: refused",)), f


def test_nonfinite_loss_on_one_rank():
    f = only(diagnose(history(lambda i: {"specs": {"r1": {"loss_nonfinite": True}}})),
             "loss_nonfinite")
    assert f.rank == 1


def test_memory_pressure():
    f = only(diagnose(history(lambda i: {"specs": {"r0": {"peak_memory_bytes": 79e9}},
                                         "gpu": {(1, 1): {"memory_used_bytes": 79e9}}})),
             "memory_pressure")
    assert f.rank == 0
    assert f.evidence == ("rank 0 peak 7.9e+10 of 8e+10 bytes", "GPU 1 on node-1 at 99%"), f


def test_critical_findings_come_first():
    snaps = history(lambda i: {"specs": {"r1": {"loss_nonfinite": True},
                                         "r2": {"straggler_score": SLOW}}})
    assert causes(diagnose(snaps)) == ["loss_nonfinite", "straggler_compute"]


@pytest.mark.parametrize("doc, count", [
    (None, 0), ([], 0), ({"ranks": "x"}, 0),
    ({"ranks": [1, {"rank": "a"}, {"rank": True}, {"rank": 1, "frames": "x"}]}, 1),
    ({"ranks": [{"rank": 1, "frames": "x", "last_collective": 3}]}, 1),
    ({"ranks": [{"rank": 1.0, "frames": [7, {"file": 5}], "last_collective": {"seq": "9"}}]}, 1),
])
def test_stack_documents_are_read_without_trust(doc, count):
    """Entries without an integer rank are skipped (a bool is not one); what the others carry
    that is not of its kind is dropped, never raised."""
    got = parse_stacks(doc)
    assert len(got) == count, got
    for s in got:
        assert s.rank == 1 and s.seq is None and s.op == "" and s.step is None, s
        assert s.frames in ((), (Frame("", 0, ""),)), s.frames


def test_a_well_formed_stack_document_is_read_whole():
    doc = {"ranks": [{"rank": r, "step": 40 + r, "phase": "forward", "stalled": r == 1,
                      "last_collective": {"op": "all_gather", "seq": 9 - r},
                      "frames": [{"file": "train.py", "line": 3, "function": "main"},
                                 {"file": "fsdp.py", "line": 7, "function": "wait"}]}
                     for r in (0, 1)]}
    got = parse_stacks(doc)
    assert [(s.rank, s.step, s.phase, s.stalled, s.op, s.seq) for s in got] == [
        (0, 40, "forward", False, "all_gather", 9), (1, 41, "forward", True, "all_gather", 8)]
    assert got[1].frames == (Frame("train.py", 3, "main"), Frame("fsdp.py", 7, "wait"))


def test_a_rank_that_never_entered_a_collective_is_the_odd_one_out():
    """No collective yet is furthest behind: that class comes first, before the ones that
    entered any (sequence numbers start at 1)."""
    behind = RankStack(rank=3, step=0, stalled=True, frames=(Frame("data.py", 5, "load"),))
    classes = merge([_stack(r, 1, "fsdp.py") for r in (0, 1, 2)] + [behind])
    assert [(c.ranks, c.seq) for c in classes] == [((3,), None), ((0, 1, 2), 1)], classes
    assert classes[0].describe() == "rank 3 at data.py:5 load (step 0, last no collective yet)"


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


# -- what each finding says: the summary and evidence a person reads ---------------------------

STORIES = {
    "hang behind in steps": (
        lambda i: {"specs": _all_stalled(r0={"heartbeat_age_s": 41.0}, r1={"step": 99})}, (),
        ("hang", 1, "rank 1 holds up 3 ranks",
         ("culprit: rank 1 (behind at step 99 (others at 100))",
          "ranks 0, 1, 2, 3 made no step for 10s or more; no step for 41s (threshold 30s)"))),
    "hang alike": (
        lambda i: {"specs": _all_stalled()}, [_stack(r, 5, "fsdp.py") for r in range(4)],
        ("hang", None, "ranks 0, 1, 2, 3 stalled, none behind the others",
         ("4 ranks at fsdp.py:123 wait (step 812, last collective #5 all_gather_into_tensor)",
          "ranks 0, 1, 2, 3 made no step for 10s or more; no step for 40s (threshold 30s)"))),
    "hang, half behind": (  # two of four behind are not "the" culprits
        lambda i: {"specs": _all_stalled(r0={"step": 99}, r1={"step": 99})}, (),
        ("hang", None, "ranks 0, 1, 2, 3 stalled, none behind the others",
         ("ranks 0, 1, 2, 3 made no step for 10s or more; no step for 40s (threshold 30s)",))),
    "straggler compute": (
        lambda i: {"specs": {"r2": {"straggler_score": SLOW, "busy_s": 0.7}}}, (),
        ("straggler_compute", 2, "rank 2 straggles: its own compute is slow",
         # the others' busy: step (0.5 + 0.002 r) x (1 - 0.1 collective wait), r = 0, 1, 3
         ("straggler score 0.60 for 10s", "busy 0.700 s vs the others' median 0.452 s"))),
    "straggler data": (
        lambda i: {"specs": {"r1": {"straggler_score": SLOW, "busy_s": 0.75,
                                    "data_wait_ratio": 0.6}}}, (),
        ("straggler_data", 1, "rank 1 straggles: it waits for data",
         # data wait 0.6 x 0.502 s against the others' 0.02 x their steps (median 0.010 s);
         # extra busy 0.75 s against the others' median 0.4536 s
         ("straggler score 0.60 for 10s", "data wait 0.301 s vs the others' median 0.010 s: "
          "0.291 s of its 0.296 s extra busy time"))),
    "throttled straggler": (
        lambda i: {"specs": {"r3": {"straggler_score": SLOW}},
                   "gpu": {(1, 1): {"clock_events": ("hw_thermal_slowdown",)}}}, (),
        ("gpu_throttled", 3, "GPU 1 on node-1 throttled (hw_thermal_slowdown) slows rank 3",
         ("clock events active for 10s: hw_thermal_slowdown",
          "rank 3 straggler score 0.60 for 10s"))),
    "slow checkpoint": (
        lambda i: {"specs": saves({3: 4.1})}, (),
        ("checkpoint_slow", 3, "checkpointing takes 60% of the time: rank 3's save holds up the "
         "others", ("the last save took 4.2s, 60% of the time since the save before it (limit "
                    "25%)", "rank 3's own save work took 4.1s of it, the other ranks' 0.1s: "
                    "they waited for rank 3"))),
    "two slow savers": (  # the slower is named, the other listed
        lambda i: {"specs": saves({2: 4.0, 3: 4.1})}, (),
        ("checkpoint_slow", 3, "checkpointing takes 60% of the time: rank 3's save holds up the "
         "others", ("the last save took 4.2s, 60% of the time since the save before it (limit "
                    "25%)", "rank 3's own save work took 4.1s of it, the other ranks' 0.1s: "
                    "they waited for rank 3", "ranks 3, 2 all saved slowly"))),
    "only two ranks have saved": (  # the wall time is theirs, not zeros for the rest
        lambda i: {"specs": {r: v for r, v in saves({1: 4.1}).items() if r in ("r0", "r1")}},
        (), ("checkpoint_slow", 1, "checkpointing takes 60% of the time: rank 1's save holds up "
             "the others", ("the last save took 4.2s, 60% of the time since the save before it "
                            "(limit 25%)", "rank 1's own save work took 4.1s of it, the other "
                            "ranks' 0.1s: they waited for rank 1"))),
    "compute straggler with no data wait": (
        lambda i: {"specs": {"r2": {"straggler_score": SLOW, "busy_s": 0.7,
                                    "data_wait_ratio": 0.0}}}, (),
        ("straggler_compute", 2, "rank 2 straggles: its own compute is slow",
         # the others' busy: step (0.5 + 0.002 r) x (1 - 0.1 collective wait), r = 0, 1, 3
         ("straggler score 0.60 for 10s", "busy 0.700 s vs the others' median 0.452 s"))),
    "data straggler among ranks with no data wait": (
        lambda i: {"specs": {**{f"r{r}": {"data_wait_ratio": 0.0} for r in (0, 2, 3)},
                             "r1": {"straggler_score": SLOW, "busy_s": 0.75,
                                    "data_wait_ratio": 0.6}}}, (),
        ("straggler_data", 1, "rank 1 straggles: it waits for data",
         ("straggler score 0.60 for 10s", "data wait 0.301 s vs the others' median 0.000 s: "
          "0.301 s of its 0.296 s extra busy time"))),
    "hang with a pod just gone": (  # its rows are down: their steps are no evidence
        lambda i: {"specs": _all_stalled(r2={"step": 99}), "down": (1,) if i == N - 1 else ()},
        (), ("hang", None, "ranks 0, 1 stalled, none behind the others",
             ("ranks 0, 1 made no step for 10s or more; no step for 40s (threshold 30s)",))),
    "every loss non-finite": (
        lambda i: {"specs": {f"r{r}": {"loss_nonfinite": True} for r in range(4)}}, (),
        ("loss_nonfinite", None, "loss is NaN/inf on ranks 0, 1, 2, 3",
         ("non-finite loss on ranks 0, 1, 2, 3 for 10s",))),
    "a pod missing": (
        lambda i: {"down": (1,) if i >= 1 else ()}, (),
        ("rank_missing", 2, "ranks 2, 3 missing",
         ("ranks 2, 3 stopped reporting 10s ago", "its target http://10.0.0.2:9520/metrics does "
          "not answer", "the node's other targets do not answer either: "
          "http://10.0.1.2:9521/metrics"))),
}


@pytest.mark.parametrize("story", STORIES)
def test_each_finding_says_what_and_where(story):
    at, stacks, (cause, rank, summary, evidence) = STORIES[story]
    f = only(diagnose(history(at), stacks), cause)
    assert (f.rank, f.summary, f.evidence) == (rank, summary, evidence), f


def test_another_nodes_dead_target_is_a_finding_of_its_own():
    snaps = history(lambda i: {"down": (1,) if i >= 1 else ()})
    bad = [dataclasses.replace(s, targets=(*s.targets, TargetStatus(
        "http://10.0.9.9:9521/metrics", "unknown", up=False, error="refused",
        pod="fsdpmon-exporter-9", node="node-9"))) for s in snaps]
    found = diagnose(bad)
    assert causes(found) == ["rank_missing", "target_down"], found
    assert not any("10.0.9.9" in e for e in found[0].evidence), found[0].evidence
    assert found[1].node == "node-9", found[1]


def test_a_hang_culprit_is_fewer_than_half_the_ranks():
    """Six ranks, two behind in steps: a third is fewer than half, so they are named."""
    from top_snapshots import T0, ranks, results

    from fsdpmon.scrape.aggregate import aggregate

    specs = ranks(3, 2, **{f"r{r}": {**STALLED, **({"step": 99} if r < 2 else {})}
                           for r in range(6)})
    snaps = []
    for i in range(N):
        snaps.append(aggregate(results(specs), now=T0 + REFRESH_S * i, source="targets",
                               previous=snaps[-1] if snaps else None))
    f = only(diagnose(snaps), "hang")
    assert (f.summary, f.evidence[0]) == (
        "ranks 0, 1 hold up 4 ranks", "culprit: ranks 0, 1 (behind at step 99 (others at 100))"), f


def test_data_wait_half_the_extra_busy_time_makes_it_a_data_straggler():
    """Exactly STRAGGLER_CAUSE_SHARE (a half) of the extra busy time in data wait: data."""
    from fsdpmon.diagnose.straggler_rules import straggler_cause
    from fsdpmon.job.snapshot import RankRow

    peers = [RankRow(rank=r, busy_s=0.5, step_time_s=1.0, data_wait_ratio=0.0) for r in (0, 1)]
    slow = RankRow(rank=2, busy_s=1.0, step_time_s=1.0, data_wait_ratio=0.25)
    assert straggler_cause(slow, [*peers, slow]) == (
        "straggler_data", "data wait 0.250 s vs the others' median 0.000 s: 0.250 s of its "
                          "0.500 s extra busy time")
    less = dataclasses.replace(slow, data_wait_ratio=0.25 - 2**-20)
    assert straggler_cause(less, [*peers, less])[0] == "straggler_compute"


def _job(n_nodes: int, per_node: int, at: Callable[[int], dict]) -> list[JobSnapshot]:
    from top_snapshots import T0, ranks, results

    from fsdpmon.scrape.aggregate import aggregate

    snaps: list[JobSnapshot] = []
    for i in range(N):
        snaps.append(aggregate(results(ranks(n_nodes, per_node), per_node=per_node, **at(i)),
                               now=T0 + REFRESH_S * i, source="targets",
                               previous=snaps[-1] if snaps else None))
    return snaps


def test_every_rank_gone_at_once_with_its_endpoint_is_the_endpoint_down():
    """Two ranks vanishing together with the endpoint that served them is the agent's doing
    (no culprit until a restarted rank says): the target is down, as the page says, its ranks
    the evidence. Ranks gone while their endpoint still answers are missing, and a one-rank
    job's rank gone is that rank."""
    gone = lambda i: {"down": (0,) if i >= 1 else ()}  # noqa: E731
    said = diagnose(_job(1, 2, gone))  # the node's pod and its exporter: two targets down
    assert causes(said) == ["target_down", "target_down"], said
    (pod,) = [f for f in said if f.pod == "llama-worker-0"]
    assert (pod.rank, pod.evidence[1:]) == (
        None, ("it served ranks 0, 1, silent with it: which rank died first, its restarted "
               "process will say",)), pod
    one = only(diagnose(_job(1, 1, gone)), "rank_missing")
    assert (one.rank, one.evidence[0]) == (0, "rank 0 stopped reporting 10s ago"), one


def test_every_rank_gone_at_once_from_an_endpoint_that_still_answers_is_ranks_missing():
    """The endpoint answers with no rank on it (its server outlived them): the ranks are
    missing, all at once, and the target is not down."""
    from top_snapshots import T0, ranks, results

    from fsdpmon.scrape.aggregate import ScrapeResult, aggregate
    from fsdpmon.scrape.wanted import new_parser

    snaps: list[JobSnapshot] = []
    for i in range(N):
        found = results(ranks(1, 2), per_node=2)
        if i >= 1:  # the training target's page, empty
            found[0] = ScrapeResult(found[0].target, new_parser().parse(""))
        snaps.append(aggregate(found, now=T0 + REFRESH_S * i, source="targets",
                               previous=snaps[-1] if snaps else None))
    said = diagnose(snaps)
    both = only(said, "rank_missing")
    assert both.rank is None and "all at once" in both.evidence[0], both


# -- the lines each rule draws: a case on each side, or exactly on it ---------------------------

def spike(losses: list[float]) -> list[Finding]:
    """The diagnosis of a healthy job whose job loss per refresh is ``losses``: with N + 2
    refreshes, the span holds the last N - 1 and the three before it are the baseline."""
    snaps = history(lambda i: {}, n=len(losses))
    return diagnose([dataclasses.replace(s, loss=v) for s, v in zip(snaps, losses, strict=True)])


def test_a_loss_spike_is_every_loss_of_the_span_above_twice_the_median_before():
    calm, n = [1.0, 1.0, 1.0], N + 2
    f = only(spike(calm + [1.0] + [3.0] * (n - 4)), "loss_spike")  # 3 before, the span high
    # the three calm refreshes before the span: as far back as the history reaches
    recent = f"median of the {3 * REFRESH_S:.0f}s before 1"
    assert (f.summary, f.evidence) == ("loss spiked: 3 vs 1 before",
                                       (f"job loss ≥ 3 for 10s, {recent}",)), f
    assert spike(calm + [1.0] + [2.0] * (n - 4)) == [], "twice the median is not above it"
    assert spike(calm + [1.0, 1.0] + [3.0] * (n - 5)) == [], "one calm loss in the span"
    assert spike(calm + [1.0] + [3.0] * (n - 5) + [math.nan]) == [], "non-finite: its own rule"
    assert spike([0.0] * 4 + [3.0] * (n - 4)) == [], "no baseline to be twice of"
    f = only(spike([0.4] * 4 + [1.0] * (n - 4)), "loss_spike")
    assert f.summary == "loss spiked: 1 vs 0.4 before", f
    # one refresh fewer: the span starts a refresh earlier, two losses before it
    assert spike(calm + [3.0] * (n - 1 - 3)) == [], "two losses are no baseline"


def test_the_lines_are_drawn_where_the_conventions_say():
    """On the line: a straggler score of exactly the threshold is none; memory at exactly
    MEMORY_PRESSURE_RATIO is pressure; a node at exactly HOST_CPU_BUSY_RATIO is saturated;
    saves at exactly CHECKPOINT_SHARE_LIMIT of the time are heavy."""
    from fsdpmon.conventions import CHECKPOINT_SHARE_LIMIT, HOST_CPU_BUSY_RATIO
    from fsdpmon.conventions import MEMORY_PRESSURE_RATIO as FULL

    assert diagnose(history(lambda i: {"specs": {"r2": {
        "straggler_score": STRAGGLER_SCORE_THRESHOLD}}})) == []
    f = only(diagnose(history(lambda i: {"specs": {"r0": {"peak_memory_bytes": FULL * 80e9}}})),
             "memory_pressure")
    assert f.rank == 0
    assert diagnose(history(lambda i: {"specs": {"r0": {
        "peak_memory_bytes": 0.94 * 80e9}}})) == []
    g = only(diagnose(history(lambda i: {"gpu": {(1, 1): {"memory_used_bytes": FULL * 80e9}}})),
             "memory_pressure")
    assert g.evidence == ("GPU 1 on node-1 at 95%",), g
    snaps = history(lambda i: {"specs": {"r2": {"straggler_score": SLOW, "busy_s": 0.7}}})
    at_line = [dataclasses.replace(s, nodes=tuple(
        dataclasses.replace(n, cpu_utilization_ratio=HOST_CPU_BUSY_RATIO if n.node == "node-1"
                            else 0.35) for n in s.nodes)) for s in snaps]
    assert only(diagnose(at_line), "host_cpu_contention").rank == 2
    at_limit = saves({3: 4.1}, share=CHECKPOINT_SHARE_LIMIT)
    heavy = only(diagnose(history(lambda i: {"specs": at_limit})), "checkpoint_slow")
    assert heavy.rank == 3
    assert diagnose(history(lambda i: {"specs": saves({3: 4.1}, share=0.24)})) == []


def test_a_rank_held_the_save_up_from_half_its_wall_time_of_own_work_over_the_others():
    """Own save work above the others' median by STRAGGLER_CAUSE_SHARE (half) of the save's
    wall time, exactly: the rank is named; a little less: the save is slow for everyone."""
    def own(seconds: float) -> Finding:
        specs = {f"r{r}": {"checkpoint_seconds": 4.0, "checkpoint_own_seconds": 0.5,
                           "checkpoint_time_ratio": 0.6} for r in range(4)}
        specs["r3"]["checkpoint_own_seconds"] = seconds
        return only(diagnose(history(lambda i: {"specs": specs})), "checkpoint_slow")

    assert own(0.5 + 0.5 * 4.0).rank == 3
    assert own(0.5 + 0.5 * 4.0 - 0.125).rank is None


def test_a_loss_that_is_not_finite_is_named_without_the_monitors_flag():
    """An older monitor serves the loss but no flag: +Inf itself says it."""
    snaps = history(lambda i: {})
    bad = [dataclasses.replace(s, ranks=tuple(
        dataclasses.replace(r, loss=math.inf) if r.rank == 1 else r for r in s.ranks))
        for s in snaps]
    assert only(diagnose(bad), "loss_nonfinite").rank == 1


def test_a_gpu_without_a_process_listing_serves_the_rank_of_its_local_index():
    """Without the exporter's process table (no tie), GPU i on a node serves the rank whose
    LOCAL_RANK is i there, as torchrun and the PyTorchJob place them."""
    snaps = history(lambda i: {"gpu": {(0, 1): {"clock_events": ("hw_slowdown",)}}})
    untied = [dataclasses.replace(s, processes=(), gpus=tuple(
        dataclasses.replace(g, ranks=()) for g in s.gpus)) for s in snaps]
    f = only(diagnose(untied), "gpu_throttled")
    assert (f.rank, f.node, f.gpu) == (1, "node-0", "1"), f


def test_places_are_the_latest_refreshs():
    """A pod that came up after the history began is placed from the newest refresh."""
    snaps = history(lambda i: {"down": (1,) if i == 0 else (),
                               "specs": {"r2": {"straggler_score": SLOW, "busy_s": 0.7}}})
    f = only(diagnose(snaps[1:]), "straggler_compute")
    assert (f.rank, f.pod, f.node) == (2, "llama-worker-1", "node-1"), f


def test_two_refreshes_a_whole_window_apart_are_enough():
    """`diagnose --interval` as long as the evidence window: the first and the last refresh
    span it, and the verdict is drawn (two samples, never one)."""
    snaps = history(lambda i: {"specs": {"r2": {"straggler_score": SLOW, "busy_s": 0.7}}})
    apart = [s for s in snaps if s.time in (snaps[0].time,
                                            snaps[0].time + DIAGNOSIS_EVIDENCE_SECONDS)]
    assert len(apart) == 2, apart
    f = only(diagnose(apart), "straggler_compute")
    assert f.evidence[0] == "straggler score 0.60 for 10s", f.evidence
    assert diagnose(apart[1:]) == []


def _swap_ties(snap: JobSnapshot, keep: set[tuple[str, str]] = frozenset()) -> JobSnapshot:
    """node-0's GPUs 0 and 1 listing each other's rank (CUDA_VISIBLE_DEVICES remapped); the
    GPUs in ``keep`` list no process (a lost GPU); the other GPUs as they are."""
    swapped = {("node-0", "0"): (1,), ("node-0", "1"): (0,)}
    return dataclasses.replace(snap, gpus=tuple(
        dataclasses.replace(g, ranks=() if (g.node, g.gpu) in keep
                            else swapped.get((g.node, g.gpu), g.ranks)) for g in snap.gpus))


def test_the_exporters_tie_wins_over_the_local_index():
    """The process NVML lists on GPU 0 is rank 1's: GPU 0's fault is rank 1's."""
    snaps = history(lambda i: {"gpu": {(0, 0): {"clock_events": ("hw_slowdown",)}}})
    f = only(diagnose([_swap_ties(s) for s in snaps]), "gpu_throttled")
    assert (f.gpu, f.rank) == ("0", 1), f


def test_a_lost_gpu_keeps_the_rank_its_last_tie_named():
    """A lost GPU lists no process: the rank is the one an older refresh tied to it."""
    snaps = history(lambda i: {"specs": _all_stalled(),
                               "gpu": {(0, 0): {"up": i < 1}}})
    tied = [_swap_ties(s, keep={("node-0", "0")} if i >= 1 else set())
            for i, s in enumerate(snaps)]
    f = only(diagnose(tied), "gpu_lost")
    assert (f.gpu, f.rank) == ("0", 1), f


def test_a_rank_whose_node_is_named_otherwise_is_found_by_its_pod():
    """A monitor that names its node differently from the exporter: the GPU of the rank's pod
    and local index."""
    snaps = history(lambda i: {"gpu": {(0, 1): {"clock_events": ("hw_slowdown",)}}})
    renamed = [dataclasses.replace(s, ranks=tuple(
        dataclasses.replace(r, node=f"ip-{r.node}") for r in s.ranks), gpus=tuple(
        dataclasses.replace(g, ranks=()) for g in s.gpus)) for s in snaps]
    f = only(diagnose(renamed), "gpu_throttled")
    assert (f.gpu, f.rank) == ("1", 1), f


def test_a_counter_that_rose_between_two_refreshes_is_named():
    snaps = history(lambda i: {"gpu": {(1, 0): {"xids": ((79, 1),) if i >= 5 else ()}}})
    apart = [snaps[0], snaps[5]]  # a whole evidence window apart
    assert only(diagnose(apart), "gpu_xid").gpu == "0"
