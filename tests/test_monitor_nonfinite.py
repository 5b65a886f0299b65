"""Each rank remembers the first step its loss, and its grad norm, went NaN or infinite, and the
batch of that step: in the JSONL and on the endpoint."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fsdpmon.monitor import Monitor, MonitorConfig
from fsdpmon.monitor.nonfinite import MAX_KEPT_STEPS, NonfiniteWatch, _floats, _one_transfer


def test_the_first_of_each_is_kept_with_its_batch_and_nothing_after_both():
    watch = NonfiniteWatch()
    for step in range(1, 6):
        loss = torch.tensor(math.nan if step >= 3 else 1.0)
        grad = math.inf if step >= 4 else 2.0
        watch.step_done(step, {"loss": loss, "grad_norm": grad, "batch": 100 * step})
    found = watch.scan()
    assert [(f.what, f.step, f.value, f.batch) for f in found] == [
        ("loss", 3, "nan", 300), ("grad_norm", 4, "inf", 400)]
    watch.step_done(6, {"loss": torch.tensor(-math.inf)})
    assert watch.scan() == [] and watch.first_step("loss") == 3
    assert watch._steps == []  # both known: nothing more is kept


def test_a_loss_handed_over_with_its_graph_is_kept_detached():
    watch = NonfiniteWatch()
    w = torch.ones(2, requires_grad=True)
    loss = (w * 2).sum()
    watch.step_done(1, {"loss": loss})
    kept = watch._steps[0][1]
    assert kept.grad_fn is None and not kept.requires_grad
    assert watch.scan() == []


def test_the_monitor_writes_the_first_and_serves_its_step(tmp_path):
    cfg = MonitorConfig(port=0, job_name="nan", log_interval=5,
                        jsonl_path=str(tmp_path / "run.jsonl"))
    mon = Monitor(cfg, tokens_per_step=1)
    for step in range(1, 13):
        with mon.step():
            bad = step >= 7
            mon.record(loss=torch.tensor(math.nan if bad else 1.0),
                       grad_norm=torch.tensor(math.inf if step >= 8 else 1.0),
                       batch={"position": 16 * (step - 1)})
    mon.close()
    lines = [json.loads(x) for x in (tmp_path / "run.rank0.jsonl").read_text().splitlines()]
    firsts = [x for x in lines if x["kind"] == "nonfinite"]
    assert [(x["what"], x["step"], x["value"], x["batch"]) for x in firsts] == [
        ("loss", 7, "nan", {"position": 96}), ("grad_norm", 8, "inf", {"position": 112})]
    steps = {x["step"]: x for x in lines if x["kind"] == "step"}
    assert steps[5]["loss_first_nonfinite_step"] is None
    assert (steps[10]["loss_first_nonfinite_step"], steps[10]["grad_norm_first_nonfinite_step"]
            ) == (7, 8)


@pytest.mark.parametrize("missing", ["loss", "grad_norm"])
def test_a_step_that_recorded_nothing_is_not_given_the_last_steps_value(tmp_path, missing):
    """record() once, then steps without it: the NaN is that one step's, not theirs."""
    watch = NonfiniteWatch()
    watch.step_done(1, {missing: math.nan})
    watch.step_done(2, {})
    assert [f.step for f in watch.scan()] == [1]


def test_steps_kept_between_log_steps_are_bounded():
    """A loop that logs rarely (or never): the steps are read once MAX_KEPT_STEPS gather."""
    watch = NonfiniteWatch()
    for step in range(1, MAX_KEPT_STEPS + 2):
        watch.step_done(step, {"loss": math.nan if step == 5 else 1.0})
        assert len(watch._steps) < MAX_KEPT_STEPS
    assert [(f.step, f.what) for f in watch.scan()] == [(5, "loss")]


def test_once_both_are_known_a_step_keeps_nothing():
    watch = NonfiniteWatch()
    watch.step_done(1, {"loss": math.nan, "grad_norm": math.inf})
    assert len(watch.scan()) == 2
    watch.step_done(2, {"loss": torch.tensor(1.0), "grad_norm": 1.0})
    assert watch._steps == [], f"{len(watch._steps)} steps kept after both firsts were found"


def meta(*shape: int) -> torch.Tensor:
    """A tensor on a device that is not the CPU (meta: shapes and devices, no data); the only
    such device a CPU-only machine has."""
    return torch.empty(shape, device="meta")


@pytest.mark.parametrize("values, one", [
    ([meta(), meta(), meta()], True),  # a loss per step, on the accelerator
    ([meta(1), meta()], True),  # a one-element vector reads as one value too
    ([meta(), torch.tensor(1.0)], False),  # one on the CPU: read one by one
    ([meta(), 1.0], False),  # a Python number beside them
    ([meta(2), meta()], False),  # not one value
    ([meta(0), meta()], False),  # no value at all
    ([torch.nn.Parameter(meta())], False),  # a subclass (DTensor is one): its own read
    ([torch.tensor(1.0), torch.tensor(2.0)], False),  # the CPU costs no sync
    ([], False),
])
def test_device_values_are_read_in_one_transfer_only_when_they_all_can_be(values, one):
    """On CUDA each read of a value is a sync; stacking them makes it one. Which values
    qualify is decided here; the transfer itself needs a device this machine lacks."""
    assert _one_transfer(values) is one, [(type(v).__name__, getattr(v, "shape", None))
                                           for v in values]


def test_values_read_one_by_one_keep_their_value_and_sign():
    got = _floats([torch.tensor(-math.inf), torch.tensor([math.nan]), 2, torch.tensor(0.5)])
    assert [repr(x) for x in got] == ["-inf", "nan", "2.0", "0.5"], got
