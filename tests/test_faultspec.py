"""The fault grammar: every kind parses into its frozen dataclass; bad specs name themselves."""

from __future__ import annotations

import dataclasses

import pytest

from fsdpmon import faultspec as fs
from fsdpmon.errors import ConfigError
from fsdpmon.trainer.config import parse_config
from fsdpmon.trainer.faults import FaultPlan


def test_unset_or_blank_means_no_fault():
    assert fs.parse(None) == () and fs.parse("") == () and fs.parse("  ;  ") == ()
    assert fs.from_sources(None, environ={}) == ()


@pytest.mark.parametrize("spec, expected", [
    ("compute-slow:rank=1,factor=1.5,from_step=3", fs.ComputeSlow(1, 1.5, 3)),
    ("data-slow:rank=2,seconds=0.2", fs.DataSlow(2, 0.2, 0)),
    ("hang:rank=1,at_step=4,where=host", fs.Hang(1, 4, "host")),
    ("hang:rank=1,at_step=4,gate=/tmp/go", fs.Hang(1, 4, "data", 0.0, "/tmp/go")),
    ("nonfinite-loss:rank=0,from_step=2,value=-inf", fs.NonfiniteLoss(0, 2, "-inf")),
    ("checkpoint-slow:rank=1,seconds=3", fs.CheckpointSlow(1, 3.0)),
    ("checkpoint-slow:rank=1,seconds=3,from_step=40", fs.CheckpointSlow(1, 3.0, 40)),
    ("compute-slow:rank=1,factor=3,after=18", fs.ComputeSlow(1, 3.0, 0, 18.0)),
    ("crash:rank=1,at_step=7", fs.Crash(1, 7)),
    ("crash-in-save:at_step=20", fs.CrashInSave(-1, 20)),
    ("pause:at_step=15,dir=/tmp/x y", fs.Pause(15, "/tmp/x y")),
    ("gpu-throttle:gpu=3,after=10,reason=power", fs.GpuThrottle(3, 10.0, "power")),
    ("xid:gpu=1,code=79,after=5", fs.Xid(1, 79, 5.0)),
    ("gpu-lost:gpu=2", fs.GpuLost(2, 0.0)),
    ("ecc-uncorrected:gpu=0,after=1.5", fs.EccUncorrected(0, 1.5)),
    (" compute-slow ", fs.ComputeSlow()),
])
def test_every_kind_parses_to_its_frozen_dataclass(spec, expected):
    (fault,) = fs.parse(spec)
    assert fault == expected, f"{spec!r} -> {fault!r}, expected {expected!r}"
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(fault, dataclasses.fields(fault)[0].name, 5)
    assert fs.parse(fs.describe(fault)) == (fault,), "describe() must round-trip"


def test_every_kind_is_documented_and_classified():
    doc = fs.__doc__ or ""
    for name, cls in fs.KINDS.items():
        assert f"  {name}:" in doc, f"kind {name} missing from the module docstring"
        assert (cls in fs.TRAINER_KINDS) != (cls in fs.GPU_KINDS), f"{name} in both or neither"


def test_several_faults_and_both_sources_apply():
    env = {fs.ENV_VAR: "xid:gpu=0,code=48; data-slow:rank=1,seconds=0.1"}
    got = fs.from_sources("crash:rank=0,at_step=3", environ=env)
    assert got == (fs.Xid(0, 48, 0.0), fs.DataSlow(1, 0.1, 0), fs.Crash(0, 3))
    assert fs.select(got, fs.DataSlow, rank=1) == [fs.DataSlow(1, 0.1, 0)]
    assert fs.select(got, fs.DataSlow, rank=0) == []
    assert fs.select([fs.CrashInSave(-1, 2)], fs.CrashInSave, rank=3, world_size=4)


@pytest.mark.parametrize("spec, words", [
    ("explode:rank=1", ["unknown kind 'explode'", "compute-slow"]),
    ("compute-slow:rank=1,speed=2", ["no key 'speed'", "factor"]),
    ("compute-slow:rank", ["expected key=value", "'rank'"]),
    ("compute-slow:factor=fast", ["factor must be a number", "'fast'"]),
    ("compute-slow:factor=0.5", ["factor must be >= 1", "'0.5'"]),
    ("compute-slow:factor=nan", ["factor must be finite"]),
    ("crash:rank=1.5", ["rank must be an integer"]),
    ("crash:rank=-1", ["rank must be >= 0"]),
    ("crash:rank=1,rank=2", ["given twice"]),
    ("hang:where=gpu", ["where must be one of data|host", "'gpu'"]),
    ("nonfinite-loss:value=big", ["nan|inf|-inf"]),
    ("gpu-throttle:reason=sunspots", ["thermal|power|hw_slowdown"]),
    ("xid:code=0", ["code must be >= 1"]),
    ("data-slow:seconds=-1", ["seconds must be >= 0"]),
    ("pause:dir=", ["dir is empty"]),
])
def test_bad_spec_is_one_config_error_naming_source_spec_and_key(spec, words):
    with pytest.raises(ConfigError) as err:
        fs.from_sources(f"crash:rank=0;{spec}", environ={})
    message = str(err.value)
    assert err.value.field == "--fault" and "\n" not in message, message
    assert spec.strip() in message, f"spec not named in {message!r}"
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_env_spec_errors_name_the_variable():
    with pytest.raises(ConfigError, match=r"^FSDPMON_FAULT: bad fault spec 'nope'"):
        fs.from_sources(None, environ={fs.ENV_VAR: "nope"})


def test_trainer_flag_rejects_a_bad_spec_before_training(monkeypatch):
    monkeypatch.delenv(fs.ENV_VAR, raising=False)
    with pytest.raises(ConfigError, match="--fault: bad fault spec 'crash:step=3'"):
        parse_config(["--fault", "crash:step=3"])
    assert parse_config(["--fault", "crash:rank=1,at_step=3"]).fault == "crash:rank=1,at_step=3"


def test_a_rank_keeps_only_the_trainer_faults_aimed_at_it():
    faults = fs.parse("compute-slow:rank=1,factor=2;xid:gpu=1;crash-in-save:at_step=4;"
                      "hang:rank=0,at_step=2")
    assert FaultPlan.for_rank(faults, 0, 2).faults == (fs.Hang(0, 2, "data"),)
    assert FaultPlan.for_rank(faults, 1, 2).faults == (fs.ComputeSlow(1, 2.0, 0),
                                                       fs.CrashInSave(-1, 4))
    assert FaultPlan.for_rank((), 1, 2).wrap_loader(iter([]), lambda: 0) is not None
