"""The glance: what one refresh shows, named in the diagnosis' causes and severities, each
fact on both sides of its line; and left to the engine once it has held for the window."""

from __future__ import annotations

from dataclasses import replace

import pytest
from top_snapshots import REFRESH_S, diagnosis_history

from fsdpmon.conventions import (
    DIAGNOSIS_EVIDENCE_SECONDS,
    MEMORY_PRESSURE_RATIO,
    STRAGGLER_CAUSE_SHARE,
    STRAGGLER_SCORE_THRESHOLD,
    Severity,
)
from fsdpmon.diagnose import CAUSES, Finding, diagnose, glance, judge
from fsdpmon.diagnose.straggler_rules import straggler_cause
from fsdpmon.job.health import settle
from fsdpmon.job.snapshot import GpuRow, JobSnapshot, RankRow, TargetStatus

A = TargetStatus("http://a/metrics", "train", True, pod="llama-worker-0", node="node-0")
B = TargetStatus("http://b/metrics", "train", True, pod="llama-worker-1", node="node-1")
CRITICAL, WARNING = Severity.CRITICAL, Severity.WARNING


def row(rank: int, **kw) -> RankRow:
    base = RankRow(rank=rank, local_rank=rank % 2, pod=f"llama-worker-{rank // 2}",
                   node=f"node-{rank // 2}", step=140, step_time_s=0.5,
                   target=f"http://{'ab'[rank // 2]}/metrics")
    return replace(base, **kw)


def snap(*changed: RankRow, **kw) -> JobSnapshot:
    """Four ranks on two pods (two targets), settled as a source settles them."""
    ranks = {r.rank: r for r in (row(0), row(1), row(2), row(3))}
    ranks.update({r.rank: r for r in changed})
    base = JobSnapshot(time=100.0, source="t", targets=(A, B), total_steps=150, world_size=4,
                       ranks=tuple(ranks[r] for r in sorted(ranks)))
    return settle(replace(base, **kw), None)


def named(s: JobSnapshot) -> list[tuple[str, Severity, str]]:
    return [(f.cause, f.severity, f.summary) for f in glance([s])]


GIB = 2**30
LINE = MEMORY_PRESSURE_RATIO * 80 * GIB
SLOW = STRAGGLER_SCORE_THRESHOLD * 0.8
STALLED = {"stalled": True, "heartbeat_age_s": 61.0, "stall_threshold_s": 30.0}

CASES = {  # name: (snapshot, what the glance names)
    "healthy": (snap(), []),
    "stalled": (snap(row(1, **STALLED)),
                [("hang", CRITICAL, "rank 1 stalled: no step within the threshold")]),
    "stalled, but gone": (snap(row(1, **STALLED, down=True, finished=True)), []),
    "target down": (snap(targets=(A, replace(B, up=False, error="timed out"))),
                    [("target_down", CRITICAL, "1 of 2 targets down: llama-worker-1")]),
    "a finished rank's target down": (
        snap(row(2, step=150, down=True), row(3, step=150, down=True),
             targets=(A, replace(B, up=False))), []),
    "never seen": (snap(world_size=5),
                   [("rank_missing", CRITICAL, "only 4 of 5 ranks report; rank 4 never seen")]),
    "gone early": (snap(row(3, down=True, seen_at=99.0, gone_at=100.0)),
                   [("rank_missing", CRITICAL,
                     "rank 3 gone before the last step (last seen at step 140/150)")]),
    "gone with the time to finish": (
        snap(row(3, down=True, seen_at=90.0, gone_at=100.0)), []),  # 10 steps x 0.5 s < 10 s
    "straggler": (snap(row(1, slowest=True, straggler_score=SLOW, busy_s=0.6)),
                  [("straggler_compute", WARNING,
                    f"rank 1 straggles: score {SLOW:.2f} < 0.75 (the others wait for it)")]),
    "flag standing on the line": (
        snap(row(1, slowest=True, straggler_score=STRAGGLER_SCORE_THRESHOLD)),
        [("straggler_compute", WARNING,
          "rank 1 straggles: score 0.75 ≥ 0.75 (the others wait for it)")]),
    "scored low, not flagged": (snap(row(1, straggler_score=SLOW)), []),
    "rank memory at the line": (
        snap(row(2, peak_memory_bytes=LINE, memory_capacity_bytes=80 * GIB)),
        [("memory_pressure", WARNING, "memory ≥95% used: rank 2")]),
    "rank memory just below": (
        snap(row(2, peak_memory_bytes=LINE * (1 - 1e-6), memory_capacity_bytes=80 * GIB)), []),
    "GPU memory at the line": (
        snap(gpus=(GpuRow(node="node-1", gpu="0", memory_used_bytes=LINE,
                          memory_total_bytes=80 * GIB),)),
        [("memory_pressure", WARNING, "memory ≥95% used: node-1/0")]),
    "GPU lost": (snap(gpus=(GpuRow(node="node-1", gpu="0"), GpuRow(node="node-1", gpu="1",
                                                                  up=False))),
                 [("gpu_lost", CRITICAL, "GPU lost: node-1/1")]),
    "non-finite loss": (snap(row(0, loss=float("inf"))),
                        [("loss_nonfinite", CRITICAL, "loss is NaN or infinite on rank 0")]),
    "the monitor's non-finite flag": (
        snap(row(0, loss_nonfinite=True), row(1, loss_nonfinite=True)),
        [("loss_nonfinite", CRITICAL, "loss is NaN or infinite on rank 0, 1")]),
    "finite loss": (snap(row(0, loss=1e30)), []),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_fact_is_named_in_the_diagnosis_vocabulary(case):
    s, expected = CASES[case]
    got = named(s)
    assert got == expected, f"{case}: {got} != {expected}"
    assert all(cause in CAUSES for cause, _, _ in got)


def test_findings_say_where_and_why():
    hang, = glance([snap(row(1, **STALLED))])
    assert (hang.rank, hang.pod, hang.node) == (1, "llama-worker-0", "node-0")
    assert hang.evidence == ("rank 1: no step for 61s, past its stall threshold (30s)",)
    several, = glance([snap(*(row(r, **STALLED) for r in range(4)))])
    assert several.summary == "rank 0, 1, 2, 3 stalled: no step within the threshold"
    assert (several.rank, several.pod, several.node) == (None, None, None)  # two pods
    down, = glance([snap(targets=(A, replace(B, up=False, error="timed out")))])
    assert (down.pod, down.node) == ("llama-worker-1", "node-1")
    assert down.evidence == ("http://b/metrics (train) does not answer: timed out",)
    many = [snap(*(row(r, **STALLED) for r in range(4)), world_size=12)]
    assert [f.summary for f in glance(many)][1] == (
        "only 4 of 12 ranks report; rank 4, 5, 6, 7, 8, 9, 10, 11 never seen")


def test_a_straggler_is_put_down_to_data_when_its_extra_time_is_data_wait():
    """The line: STRAGGLER_CAUSE_SHARE of the extra busy time (over the median rank's) is
    extra data wait. 0.2 s extra busy time; data wait = ratio x 0.5 s step time."""
    peers = [row(r, busy_s=0.4, data_wait_ratio=0.0) for r in (0, 1, 2)]
    line = STRAGGLER_CAUSE_SHARE * 0.2 / 0.5
    for ratio, cause in ((line * 1.001, "straggler_data"), (line * 0.999, "straggler_compute")):
        slow = row(3, busy_s=0.6, data_wait_ratio=ratio)
        assert straggler_cause(slow, [*peers, slow])[0] == cause, ratio
        flagged = replace(slow, slowest=True, straggler_score=SLOW)
        assert [f.cause for f in glance([snap(*peers, flagged)])] == [cause], ratio


N = int(DIAGNOSIS_EVIDENCE_SECONDS // REFRESH_S) + 2  # refreshes spanning the window, and one


def _stalled_from(first: int):
    """Rank 1 stalled from refresh ``first`` on."""
    return lambda i: {"specs": {"r1": STALLED}} if i >= first else {}


def test_a_fact_that_held_for_the_window_is_the_engines_to_name():
    times = [s.time for s in diagnosis_history(lambda i: {}, N)]
    start = max(i for i, t in enumerate(times) if t <= times[-1] - DIAGNOSIS_EVIDENCE_SECONDS)
    held = diagnosis_history(_stalled_from(start), N)  # from the window's first refresh on
    verdict = judge(held)
    assert [f.cause for f in verdict.findings] == ["hang"] and verdict.glance == ()
    # One refresh short of the window: no finding yet; the glance says what it sees.
    young = diagnosis_history(_stalled_from(start + 1), N)
    verdict = judge(young)
    assert verdict.findings == ()
    assert [(f.cause, f.summary) for f in verdict.glance] == [
        ("hang", "rank 1 stalled: no step within the threshold")]
    assert diagnose(young) == [] and glance(young) == list(verdict.glance)


def test_a_new_fact_beside_a_confirmed_one_is_still_shown():
    history = diagnosis_history(
        lambda i: {"specs": {"r1": STALLED, **({"r3": STALLED} if i == N - 1 else {})}}, N)
    verdict = judge(history)
    assert [f.cause for f in verdict.findings] == ["hang"]
    assert [f.summary for f in verdict.glance] == [
        "rank 3 stalled: no step within the threshold"]


def test_one_refresh_is_the_glance_alone():
    s = snap(row(1, **STALLED))
    verdict = judge([s])
    assert verdict.findings == () and verdict.gathering and verdict.seconds == 0.0
    assert [f.cause for f in verdict.glance] == ["hang"]
    assert verdict.critical == verdict.glance
    assert judge([]).glance == () and glance([]) == []


def test_severity_is_one_word_for_findings_and_json():
    f = Finding("hang", "critical", "x")
    assert f.severity is Severity.CRITICAL and f.to_dict()["severity"] == "critical"
    with pytest.raises(ValueError):
        Finding("hang", "page", "x")
