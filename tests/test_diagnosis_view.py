"""top's Diagnosis view (key 5) and the header's top finding, rendered from built snapshot
histories; the key layouts are compared exactly at 200x50 and 80x24.

Regenerate the golden files after an intended layout change with
``FSDPMON_UPDATE_GOLDEN=1 pytest tests/test_diagnosis_view.py`` and review the diff.
"""

from __future__ import annotations

import pytest
from test_views import check_golden, render
from top_snapshots import REFRESH_S, diagnosis_history

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS, STRAGGLER_SCORE_THRESHOLD
from fsdpmon.diagnose import RankStack, Verdict, judge
from fsdpmon.diagnose.stacks import Frame
from fsdpmon.top.ui_state import ViewState, handle_key
from fsdpmon.top.views import frame

N = int(DIAGNOSIS_EVIDENCE_SECONDS // REFRESH_S) + 2
SLOW = {"straggler_score": STRAGGLER_SCORE_THRESHOLD * 0.8}
STALL = {"stalled": True, "heartbeat_age_s": 45.0}


def _stack(rank: int, seq: int, inner: tuple[str, int, str]) -> RankStack:
    frames = (Frame("/app/trainer/train.py", 210, "main"),
              Frame("/app/trainer/loop.py", 88, "train_step"), Frame(*inner))
    return RankStack(rank=rank, step=812, stalled=True, op="all_gather_into_tensor", seq=seq,
                     frames=frames)


GATHER = ("/usr/lib/python3/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 301,
          "foreach_all_gather")
LOADER = ("/app/trainer/data.py", 123, "next_batch")
CASES = {
    "healthy": (lambda i: {}, ()),
    "straggler": (lambda i: {"specs": {"r3": {**SLOW, "busy_s": 0.7}}}, ()),
    "hang": (lambda i: {"specs": {f"r{r}": STALL for r in range(4)}},
             [_stack(r, 21937, GATHER) for r in (0, 1, 3)] + [_stack(2, 21936, LOADER)]),
    "throttled": (lambda i: {"specs": {"r1": SLOW},
                             "gpu": {(0, 1): {"clock_events": ("hw_thermal_slowdown",)}}}, ()),
}


def _verdict(name: str):
    at, stacks = CASES[name]
    snaps = diagnosis_history(at, N)
    return snaps[-1], judge(snaps, stacks)


@pytest.mark.parametrize("size", [(200, 50), (80, 24)])
@pytest.mark.parametrize("name", list(CASES))
def test_diagnosis_view_layouts(name, size):
    width, height = size
    snap, verdict = _verdict(name)
    state = handle_key(ViewState(), "5")
    assert state.view == "diagnosis"
    text = render(frame(snap, state, height, verdict=verdict), width, height)
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= height and max(map(len, lines)) <= width, (len(lines), height)
    check_golden(f"diagnosis_{name}_{width}x{height}", text)
    if name == "healthy":
        assert "no findings" in text
    else:  # the header names the top finding, on every view
        cause = verdict.findings[0].cause
        assert f"! {cause}:" in text
        ranks_screen = render(frame(snap, ViewState(), height, verdict=verdict), width, height)
        assert f"! {cause}:" in ranks_screen


def test_hang_shows_the_odd_class_first_with_its_frames():
    snap, verdict = _verdict("hang")
    text = render(frame(snap, ViewState(view="diagnosis"), 50, verdict=verdict), 200, 50)
    odd, rest = text.index("rank 2 at data.py:123 next_batch"), text.index("3 ranks at")
    assert odd < rest and "collective #21936" in text and "loop.py:88 train_step" in text


def test_gathering_evidence_before_a_verdict():
    snap, _ = _verdict("straggler")
    text = render(frame(snap, ViewState(view="diagnosis"), 24,
                        verdict=Verdict((), 4.0, DIAGNOSIS_EVIDENCE_SECONDS)))
    assert "gathering evidence: 4s of the 10s" in text


def test_help_lists_the_diagnosis_key():
    text = render(frame(_verdict("healthy")[0], ViewState(view="help"), 24))
    assert "5 Diagnosis" in text and "diagnosis" in text.split("Tab")[0]
