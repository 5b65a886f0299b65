"""What the glance names, and how much: one culprit by its rank, pod, node and GPU, several by
what they share; summaries that name up to their limit and count the rest; evidence capped;
the text a user reads when a figure is missing. Every limit pinned on both sides."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fsdpmon.diagnose import Finding, glance
from fsdpmon.diagnose.glance import MAX_EVIDENCE, MAX_NAMED, MAX_PLACES
from fsdpmon.diagnose.straggler_rules import straggler_cause
from fsdpmon.job.health import settle
from fsdpmon.job.snapshot import GpuRow, JobSnapshot, RankRow, TargetStatus

GIB = 2**30
STALLED = {"stalled": True, "heartbeat_age_s": 61.0, "stall_threshold_s": 30.0}


def row(rank: int, **kw) -> RankRow:
    """Rank ``rank``, two ranks a pod: pod and node ``rank // 2``, GPU ``rank % 2``."""
    return replace(RankRow(rank=rank, local_rank=rank % 2, pod=f"llama-worker-{rank // 2}",
                           node=f"node-{rank // 2}", step=140, step_time_s=0.5,
                           target=f"http://{rank // 2}/metrics"), **kw)


def target(pod: int, up: bool = True, kind: str = "train") -> TargetStatus:
    port = 9520 if kind == "train" else 9521
    return TargetStatus(f"http://{pod}/metrics" if kind == "train" else f"http://{pod}:{port}/",
                        kind, up, pod=f"llama-worker-{pod}", node=f"node-{pod}")


def job(world: int, *changed: RankRow, down: tuple[int, ...] = (), **kw) -> JobSnapshot:
    """``world`` ranks on world // 2 pods; the training targets of the pods in ``down`` do not
    answer. Settled as a source settles it."""
    rows = {r: row(r) for r in range(world)} | {r.rank: r for r in changed}
    base = JobSnapshot(time=100.0, source="t", total_steps=150, world_size=world,
                       targets=tuple(target(p, p not in down) for p in range(world // 2)),
                       ranks=tuple(rows[r] for r in sorted(rows)))
    return settle(replace(base, **kw), None)


def one(s: JobSnapshot, cause: str) -> Finding:
    found = [f for f in glance([s]) if f.cause == cause]
    assert len(found) == 1, f"{len(found)} {cause} findings: {glance([s])}"
    return found[0]


def place(f: Finding) -> tuple:
    return f.rank, f.pod, f.node, f.gpu


def stalled(n: int) -> Finding:
    return one(job(10, *(row(r, **STALLED) for r in range(n))), "hang")


def test_a_summary_names_up_to_its_limit_and_counts_the_rest():
    assert MAX_NAMED == MAX_EVIDENCE == 8
    at = stalled(8)
    assert at.summary == "rank 0, 1, 2, 3, 4, 5, 6, 7 stalled: no step within the threshold", (
        at.summary)
    assert len(at.evidence) == 8, at.evidence
    over = stalled(10)
    assert over.summary == ("rank 0, 1, 2, 3, 4, 5, 6, 7 (+2 more) stalled: no step within the "
                            "threshold"), over.summary
    assert len(over.evidence) == 8 and over.evidence[-1].startswith("rank 7:"), over.evidence
    just = stalled(9)
    assert "7 (+1 more) stalled" in just.summary and len(just.evidence) == 8, (
        just.summary, len(just.evidence))


def test_a_stall_flag_served_without_its_threshold_says_it_is_unknown():
    f = one(job(4, row(1, stalled=True, heartbeat_age_s=61.0)), "hang")
    assert f.evidence == ("rank 1: no step for 61s, past its stall threshold (unknown)",), (
        f.evidence)


@pytest.mark.parametrize("n, names", [
    (4, "4 of 5 targets down: llama-worker-0, llama-worker-1, llama-worker-2, llama-worker-3"),
    (5, "5 of 5 targets down: llama-worker-0, llama-worker-1, llama-worker-2, llama-worker-3 ..."),
])
def test_targets_down_names_four_pods_then_an_ellipsis(n, names):
    f = one(job(10, down=tuple(range(n))), "target_down")
    assert f.summary == names, f"{f.summary!r} != {names!r}"


def test_never_seen_counts_only_the_ranks_below_the_world_size():
    """A stray row of rank 5 (a pod of an older, larger job) is no rank of this world of 5."""
    f = one(job(4, row(5), world_size=5), "rank_missing")
    assert f.summary == "only 4 of 5 ranks report; rank 4 never seen", f.summary
    assert f.rank == 4, f
    two = one(job(4, world_size=6), "rank_missing")
    assert two.summary == "only 4 of 6 ranks report; rank 4, 5 never seen", two.summary
    assert two.rank is None, two


GONE = {"down": True, "seen_at": 99.0, "gone_at": 100.0}


def test_one_rank_gone_is_named_with_its_place_several_by_what_they_share():
    f = one(job(4, row(3, **GONE, step=None)), "rank_missing")
    assert f.evidence == ("rank 3 stopped reporting at step ?, short of its last",), f.evidence
    assert place(f)[:3] == (3, "llama-worker-1", "node-1"), place(f)
    f = one(job(4, row(2, **GONE), row(3, **GONE)), "rank_missing")
    assert place(f) == (None, "llama-worker-1", "node-1", None), place(f)
    f = one(job(4, row(1, **GONE), row(3, **GONE)), "rank_missing")
    assert place(f) == (None, None, None, None), place(f)


def test_a_non_finite_loss_on_one_rank_names_it_on_several_what_they_share():
    f = one(job(4, row(2, loss=float("nan"))), "loss_nonfinite")
    assert place(f)[:3] == (2, "llama-worker-1", "node-1"), place(f)
    f = one(job(4, row(2, loss_nonfinite=True), row(3, loss_nonfinite=True)), "loss_nonfinite")
    assert place(f) == (None, "llama-worker-1", "node-1", None), place(f)
    f = one(job(4, row(0, loss_nonfinite=True), row(3, loss_nonfinite=True)), "loss_nonfinite")
    assert place(f) == (None, None, None, None), place(f)


def tight(rank: int) -> RankRow:
    return row(rank, peak_memory_bytes=80 * GIB, memory_capacity_bytes=80 * GIB)


def test_memory_names_its_one_rank_and_counts_past_six():
    assert MAX_PLACES == 6
    f = one(job(4, tight(2)), "memory_pressure")
    assert place(f)[:3] == (2, "llama-worker-1", "node-1"), place(f)
    six = one(job(8, *(tight(r) for r in range(6))), "memory_pressure")
    assert six.summary == "memory ≥95% used: rank 0, rank 1, rank 2, rank 3, rank 4, rank 5", (
        six.summary)
    seven = one(job(8, *(tight(r) for r in range(7))), "memory_pressure")
    assert seven.summary.endswith("rank 4, rank 5 (+1 more)"), seven.summary
    assert len(seven.evidence) == 7, seven.evidence


def gpus(lost: set[tuple[int, int]], nodes: int = 4) -> tuple[GpuRow, ...]:
    return tuple(GpuRow(node=f"node-{n}", gpu=str(g), up=(n, g) not in lost)
                 for n in range(nodes) for g in range(2))


def test_one_gpu_lost_is_named_with_its_rank_several_by_their_node():
    f = one(job(8, gpus=gpus({(1, 1)})), "gpu_lost")
    assert place(f) == (3, "llama-worker-1", "node-1", "1"), place(f)
    assert f.evidence == ("GPU 1 on node-1 not seen up: NVML reports it lost",), f.evidence
    f = one(job(8, gpus=gpus({(1, 0), (1, 1)})), "gpu_lost")
    assert place(f) == (None, None, "node-1", None), place(f)
    f = one(job(8, gpus=gpus({(1, 0), (2, 0)})), "gpu_lost")
    assert place(f) == (None, None, None, None), place(f)


def test_a_gpu_behind_a_silent_exporter_is_said_so():
    s = job(4, gpus=gpus({(1, 0)}, nodes=2))
    s = replace(s, targets=(*s.targets, target(1, up=False, kind="exporter")))
    f = one(s, "gpu_lost")
    assert f.evidence == ("GPU 0 on node-1 not seen up: its node's exporter does not answer",), (
        f.evidence)


def test_lost_gpus_are_named_up_to_six():
    six = one(job(8, gpus=gpus({(n, g) for n in range(3) for g in range(2)})), "gpu_lost")
    assert six.summary == "GPU lost: node-0/0, node-0/1, node-1/0, node-1/1, node-2/0, node-2/1", (
        six.summary)
    seven = one(job(8, gpus=gpus({(n, g) for n in range(4) for g in range(2)} - {(3, 1)})),
                "gpu_lost")
    assert seven.summary.endswith("node-2/1 (+1 more)"), seven.summary


PEERS = [row(r, busy_s=0.5, data_wait_ratio=0.02) for r in (0, 1, 2)]


def test_a_straggler_without_its_busy_time_is_not_said_to_be_busy_zero():
    slow = row(3, busy_s=None, data_wait_ratio=0.6)
    got = straggler_cause(slow, [*PEERS, slow])
    assert got == ("straggler_compute", "busy time not served; the others' median 0.500 s"), got


def test_data_wait_without_a_step_time_is_no_data_time():
    """The data wait is a share of the step: with no step time served it is no seconds, so
    the extra busy time is not put down to data."""
    slow = row(3, busy_s=0.75, data_wait_ratio=0.6, step_time_s=None)
    got = straggler_cause(slow, [*PEERS, slow])
    assert got == ("straggler_compute", "busy 0.750 s vs the others' median 0.500 s"), got
    known = replace(slow, step_time_s=0.5)  # the control: with its step time, it is data
    assert straggler_cause(known, [*PEERS, known])[0] == "straggler_data"


def test_a_flagged_straggler_scored_zero_is_shown_at_zero():
    """Score 0: the others' median busy time is nil (a rank alone doing the work)."""
    f = one(job(4, row(1, slowest=True, straggler_score=0.0, busy_s=0.6)), "straggler_compute")
    assert f.summary == "rank 1 straggles: score 0.00 < 0.75 (the others wait for it)", f.summary


def test_no_extra_busy_time_is_never_put_down_to_data():
    """Data wait above the others' but no busier than them: nothing extra to explain."""
    level = row(3, busy_s=0.5, data_wait_ratio=0.6)
    got = straggler_cause(level, [*PEERS, level])
    assert got == ("straggler_compute", "busy 0.500 s vs the others' median 0.500 s"), got
    above = replace(level, busy_s=0.51)
    assert straggler_cause(above, [*PEERS, above])[0] == "straggler_data"
