"""The snapshot is frozen plain data with a strict JSON form (`--json`, the demo)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from support import rounded
from top_snapshots import ranks, snapshot

from fsdpmon.diagnose import judge
from fsdpmon.job.snapshot import JobSnapshot, JobState, RankRow
from fsdpmon.top.cli import snapshot_json


def test_to_json_is_strict_and_complete():
    snap = snapshot(ranks(r1={"loss": float("nan")}))
    assert json.loads(snapshot_json(snap, judge([]))) == json.loads(snap.to_json()) | {
        "findings": []}  # the snapshot's keys, and the findings
    data = json.loads(snapshot_json(snap, judge([snap])))  # what `--json` prints
    assert data["state"] == "DEGRADED" and data["job_name"] == "llama"
    assert data["progress"] == rounded(0.1)
    assert data["ranks"][1]["loss"] is None  # NaN is not JSON
    nonfinite = next(f for f in data["findings"] if f["cause"] == "loss_nonfinite")
    assert nonfinite == {"cause": "loss_nonfinite", "severity": "critical", "rank": 1,
                         "pod": "llama-worker-0", "node": "node-0", "gpu": "1",
                         "summary": "loss is NaN or infinite on rank 1",
                         "evidence": ["rank 1 serves a non-finite loss"],
                         "next_step": nonfinite["next_step"], "stacks": []}, nonfinite
    assert "alerts" not in data  # the findings took their place
    assert data["ranks"][0].keys() >= {"rank", "pod", "node", "step", "step_time_s", "stalled"}
    assert data["gpus"][0]["utilization_history"] and data["history"]["tokens_per_second"]
    assert data["targets"][0].keys() >= {"url", "up", "error", "kind"}
    assert {t["kind"] for t in data["targets"]} == {"train", "exporter"}


def test_frozen_and_derived_fields():
    snap = JobSnapshot(time=0.0, source="targets", step=50, total_steps=200,
                       ranks=(RankRow(rank=0, stalled=True), RankRow(rank=1)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.step = 3  # type: ignore[misc]
    assert snap.progress == 0.25 and snap.stalled_ranks == (0,)
    assert snap.state is JobState.DOWN and snap.targets_up == 0
    assert RankRow(rank=2, down=True, stalled=True, slowest=True).flags == "DOWN STALLED SLOWEST"


def test_rows_built_without_init_equal_those_built_with_it():
    """frozen.maker fills a frozen row's __dict__ directly (the generated __init__ was most of a
    2048-rank refresh's row building): the rows, and each target's result and status, are the
    same objects as the classes' own."""
    from fsdpmon.job.snapshot import GpuRow, NodeRow, ProcessRow, TargetStatus
    from fsdpmon.scrape.filing import ScrapeResult, Target
    from fsdpmon.scrape.frozen import maker

    for cls, required in ((RankRow, {"rank": 7}), (GpuRow, {"node": "n", "gpu": "1"}),
                          (NodeRow, {"node": "n"}), (ProcessRow, {"node": "n", "pid": 9}),
                          (TargetStatus, {"url": "u", "kind": "train", "up": True}),
                          (ScrapeResult, {"target": Target("u"), "samples": ()})):
        values = {**required, dataclasses.fields(cls)[-1].name: None}  # a default overridden too
        for given in (required, values):
            made, built = maker(cls)(**given), cls(**given)
            assert made == built and hash(made) == hash(built) and repr(made) == repr(built), \
                f"{cls.__name__}: {made!r} != {built!r}"
            assert list(vars(made)) == list(vars(built)), f"{cls.__name__}: field order"
            with pytest.raises(dataclasses.FrozenInstanceError):
                made.node = "other"  # type: ignore[misc, union-attr]
    with pytest.raises(TypeError, match="JobSnapshot"):
        maker(JobSnapshot)  # a default_factory field: not for the maker


def test_a_row_made_from_its_accumulator_takes_it_over_and_fills_in_its_defaults():
    """maker's ``filed`` argument (a row's accumulator) becomes the row's __dict__, not a copy:
    the fields it lacks get their defaults and ``values`` win; entries that are no field
    (filing's bookkeeping, e.g. a rank's total_steps) stay there but are not the row's: ==,
    hash, repr and asdict are what the class's own __init__ gives."""
    from fsdpmon.scrape.frozen import maker

    make = maker(RankRow)
    for extra in ({"total_steps": 100.0, "world_size": 8}, {"rss_bytes": 3.0}, {}):
        filed = {"loss": 2.5, "pod": "p-0", "step": 7.0, **extra}
        made = make(filed, rank=3, step=7)
        built = RankRow(rank=3, loss=2.5, pod="p-0", step=7)
        assert made == built and hash(made) == hash(built) and repr(made) == repr(built), \
            f"with {sorted(extra)}: {made!r} != {built!r}"
        assert dataclasses.asdict(made) == dataclasses.asdict(built), f"with {sorted(extra)}"
        assert vars(made) is filed, "the accumulator was copied"
        assert vars(made) == {**vars(built), **extra}, \
            f"with {sorted(extra)}: {sorted(vars(made).keys() ^ vars(built).keys())}"
        assert type(made.step) is int, f"values win over filed: step {made.step!r}"
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.loss = 1.0  # type: ignore[misc]
    assert make(None, rank=1) == RankRow(rank=1) and make(rank=1) == RankRow(rank=1)
    with pytest.raises((TypeError, AttributeError)):
        make([("loss", 1.0)], rank=1)  # not a dict
