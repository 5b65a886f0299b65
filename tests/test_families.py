"""The shared encoder: catalog entry + values -> the families both endpoints serve."""

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from fsdpmon.catalog import GPU_POWER_WATTS, HOST_LOAD1, TRAIN_STEP_DURATION_SECONDS
from fsdpmon.families import Families

GPU = ["0", "GPU-1", "H100", "n1", "", "", ""]


class _Frozen:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def _text(out: Families) -> str:
    registry = CollectorRegistry()
    registry.register(_Frozen(out.families()))
    return openmetrics(registry).decode()


def test_type_help_unit_and_labels_come_from_the_catalog():
    out = Families()
    out.add(GPU_POWER_WATTS, GPU, 300.0)
    out.add(HOST_LOAD1, ["n1"], 0.5)
    text = _text(out)
    assert "# TYPE fsdpmon_gpu_power_watts gauge" in text, text
    assert "# UNIT fsdpmon_gpu_power_watts watts" in text, text
    assert "# UNIT fsdpmon_host_load1" not in text, text  # no unit in the name, none declared
    assert 'fsdpmon_gpu_power_watts{container="",gpu="0",model="H100",' in text, text


def test_histogram_buckets_pass_through():
    out = Families()
    buckets = [(repr(b), float(i)) for i, b in enumerate(TRAIN_STEP_DURATION_SECONDS.buckets)]
    out.histogram(TRAIN_STEP_DURATION_SECONDS, ["j", "0", "0"],
                  [*buckets, ("+Inf", float(len(buckets)))], 1.5)
    text = _text(out)
    count = 'fsdpmon_train_step_duration_seconds_count{job_name="j",local_rank="0",rank="0"}'
    assert f"{count} {len(buckets)}.0" in text, text


def test_a_wrong_label_count_is_a_caller_bug():
    with pytest.raises(ValueError, match="fsdpmon_host_load1: 2 label values for 1"):
        Families().add(HOST_LOAD1, ["n1", "extra"], 1.0)
    with pytest.raises(ValueError, match="histogram"):
        Families().add(TRAIN_STEP_DURATION_SECONDS, ["j", "0", "0"], 1.0)
