"""The catalog obeys the project's metric conventions; every other component relies on that."""

import re

from fsdpmon import catalog
from fsdpmon.catalog import Kind

BASE_UNIT_SUFFIX = {
    "seconds": "_seconds",
    "bytes": "_bytes",
    "ratio": "_ratio",
    "celsius": "_celsius",
    "watts": "_watts",
    "joules": "_joules",
    "hertz": "_hertz",
}
RESERVED = {"job", "instance", "le", "quantile"}


def test_names_are_unique_and_prefixed():
    names = [m.name for m in catalog.ALL]
    assert len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"fsdpmon_[a-z0-9_]+", name), name


def test_counters_end_in_total_and_nothing_else_does():
    for m in catalog.ALL:
        assert (m.kind is Kind.COUNTER) == m.name.endswith("_total"), m.name


def test_unit_is_in_the_name():
    for m in catalog.ALL:
        if m.unit:
            suffix = BASE_UNIT_SUFFIX[m.unit]
            stem = m.name.removesuffix("_total")
            assert stem.endswith(suffix), m.name


def test_info_metrics_are_gauges_and_labels_are_not_reserved():
    for m in catalog.ALL:
        if m.name.endswith("_info"):
            assert m.kind is Kind.GAUGE
        assert not RESERVED & set(m.labels), m.name
        assert len(set(m.labels)) == len(m.labels), m.name


def test_histograms_have_buckets_and_expand_to_series():
    hist = catalog.get("fsdpmon_train_step_duration_seconds")
    assert hist.buckets == tuple(sorted(hist.buckets))
    assert "fsdpmon_train_step_duration_seconds_bucket" in catalog.all_series_names()


def test_unknown_metric_is_named_in_the_error():
    try:
        catalog.get("fsdpmon_nope")
    except KeyError as exc:
        assert "fsdpmon_nope" in str(exc)
    else:
        raise AssertionError("expected KeyError")
